//! `mock://` upstream URLs: which built-in mock a `base_url` names, and
//! the pace a mock streams at when the config leaves it unset. The mock
//! server itself is `proxy::mock`; the config reads these to check a file
//! and to print it.

/// The only built-in mock, as written in a config.
pub const ECHO_URL: &str = "mock://echo";
/// Pace defaults: about 25 words a second, slow enough to watch a reply
/// stream and to interrupt it by hand.
pub const DEFAULT_CHUNK_DELAY_MS: u64 = 40;
pub const DEFAULT_WORDS_PER_CHUNK: usize = 1;

/// Which built-in mock a `mock://` URL names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MockKind {
    /// Echoes the conversation it received (`proxy::mock::echo::reply`).
    Echo,
}

#[derive(Debug, thiserror::Error)]
#[error("({url:?}) is not a built-in mock upstream; the only one is \"{ECHO_URL}\"")]
pub struct UnknownMock {
    url: String,
}

impl MockKind {
    /// `None` when `base_url` is not a `mock://` URL, so it is an ordinary
    /// upstream; an error when it is one but names no built-in mock.
    pub fn from_base_url(base_url: &str) -> Option<Result<Self, UnknownMock>> {
        let url = url::Url::parse(base_url).ok()?;
        if url.scheme() != "mock" {
            return None;
        }
        let plain = url.username().is_empty()
            && url.password().is_none()
            && url.port().is_none()
            && matches!(url.path(), "" | "/")
            && url.query().is_none()
            && url.fragment().is_none();
        Some(match url.host_str() {
            Some("echo") if plain => Ok(MockKind::Echo),
            _ => Err(UnknownMock {
                url: base_url.to_owned(),
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_mock_echo_is_a_mock() {
        for url in ["mock://echo", "mock://echo/", "MOCK://echo"] {
            assert!(matches!(
                MockKind::from_base_url(url),
                Some(Ok(MockKind::Echo))
            ));
        }
        for url in [
            "mock://parrot",
            "mock://echo/v1",
            "mock://echo:80",
            "mock://",
            "mock:echo",
        ] {
            let e = MockKind::from_base_url(url).unwrap().unwrap_err();
            assert!(e.to_string().contains("mock://echo"), "{e}");
        }
        for url in ["http://echo", "https://api.openai.com/v1", "not a url"] {
            assert!(MockKind::from_base_url(url).is_none(), "{url}");
        }
    }
}
