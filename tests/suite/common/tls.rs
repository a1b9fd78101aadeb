//! An HTTPS server whose certificate no client trusts: self-signed, for
//! `secure.recall.test` and 127.0.0.1, not a CA, valid until 2126.

use std::net::SocketAddr;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

const CERT: &str = "-----BEGIN CERTIFICATE-----
MIIBuDCCAV2gAwIBAgIUJFgFJg/2RsA+FaeeqWfvBJIkL9swCgYIKoZIzj0EAwIw
HzEdMBsGA1UEAwwUcmVjYWxsIHRlc3QgdXBzdHJlYW0wIBcNMjYxMTI2MTQwNzAz
WhgPMjEyNjExMDIxNDA3MDNaMB8xHTAbBgNVBAMMFHJlY2FsbCB0ZXN0IHVwc3Ry
ZWFtMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAERSPavcMYUgpngCsNMWalO/2g
RMThj9vAojUAGSDq8laXLTezJze5bJ22Xwc/juusmAHV7708laNi/nGFu6zc4KN1
MHMwHQYDVR0OBBYEFOk7cBDRbcShxAcXNXL/P+x6djUXMB8GA1UdIwQYMBaAFOk7
cBDRbcShxAcXNXL/P+x6djUXMCMGA1UdEQQcMBqCEnNlY3VyZS5yZWNhbGwudGVz
dIcEfwAAATAMBgNVHRMBAf8EAjAAMAoGCCqGSM49BAMCA0kAMEYCIQDxeX7QMnxf
RpThsRy0oJCcFy8ND7WiCZ8VlTT9lbFYAgIhAJGr9Bv8Dzm9poKMawE7Kv2BKe31
N6UwR8gc0+vBhp1Z
-----END CERTIFICATE-----
";

const KEY: &str = "-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgPOBMHOMRL6pMdGOq
ZZPf+0iW4rOYWNlapeqS7VoVAjGhRANCAARFI9q9wxhSCmeAKw0xZqU7/aBExOGP
28CiNQAZIOryVpctN7MnN7lsnbZfBz+O66yYAdXvvTyVo2L+cYW7rNzg
-----END PRIVATE KEY-----
";

/// Starts the server; every connection gets a TLS handshake, which a
/// client checking certificates refuses.
pub async fn self_signed_server() -> SocketAddr {
    let cert = CertificateDer::from_pem_slice(CERT.as_bytes()).unwrap();
    let key = PrivateKeyDer::from_pem_slice(KEY.as_bytes()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert], key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let _ = acceptor.accept(tcp).await;
            });
        }
    });
    addr
}
