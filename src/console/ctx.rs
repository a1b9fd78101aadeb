//! What the guard (auth.rs) hands every console handler, and the names
//! the CSRF token goes by in forms and headers: apart from the guard, so
//! that the pages it renders can take them too.

use crate::api::auth::Access;

pub const CSRF_HEADER: &str = "x-csrf-token";
pub const CSRF_FIELD: &str = "csrf";

/// What every console handler gets from the guard.
#[derive(Clone, Debug)]
pub struct Ctx {
    /// None only on the sign-in page, for whoever is not signed in.
    pub access: Option<Access>,
    pub csrf: String,
    /// Signed in with a cookie (so a sign-out makes sense).
    pub signed_in: bool,
}
