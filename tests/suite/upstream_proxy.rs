//! Upstreams reached through the proxies the environment names
//! (`HTTP_PROXY`, `HTTPS_PROXY`, `NO_PROXY`). A binary of its own with one
//! test: the environment is the process's, and no other test may see it.

use crate::common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use common::*;
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// A proxy that records each request's head: it answers a forwarded
/// request itself with a chat completion, and tunnels a CONNECT to `tls`
/// whatever host it names.
async fn start_proxy(tls: SocketAddr) -> (SocketAddr, Arc<Mutex<Vec<String>>>) {
    let heads = Arc::new(Mutex::new(Vec::new()));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::clone(&heads);
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let seen = Arc::clone(&seen);
            tokio::spawn(async move { serve(tcp, tls, seen).await });
        }
    });
    (addr, heads)
}

async fn serve(tcp: TcpStream, tls: SocketAddr, seen: Arc<Mutex<Vec<String>>>) {
    let mut conn = BufReader::new(tcp);
    loop {
        let mut head = String::new();
        loop {
            let mut line = String::new();
            if conn.read_line(&mut line).await.unwrap_or(0) == 0 {
                return;
            }
            head.push_str(&line);
            if line == "\r\n" {
                break;
            }
        }
        seen.lock().unwrap().push(head.clone());
        if head.starts_with("CONNECT ") {
            conn.get_mut()
                .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                .await
                .unwrap();
            let mut upstream = TcpStream::connect(tls).await.unwrap();
            let _ = tokio::io::copy_bidirectional(&mut conn, &mut upstream).await;
            return;
        }
        let length = head
            .lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("content-length: ")
                    .map(str::to_owned)
            })
            .map_or(0, |n| n.trim().parse::<usize>().unwrap());
        let mut body = vec![0; length];
        conn.read_exact(&mut body).await.unwrap();
        let answer = json!({
            "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": "via the proxy"}}]
        })
        .to_string();
        let response = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{answer}",
            answer.len()
        );
        conn.get_mut().write_all(response.as_bytes()).await.unwrap();
    }
}

#[test]
fn upstreams_go_through_the_environments_proxies() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let tls = common::tls::self_signed_server().await;
        let (proxy, heads) = start_proxy(tls).await;
        // Before anything reads the environment; the test client and the
        // direct upstream on loopback are excluded by NO_PROXY.
        std::env::set_var("HTTP_PROXY", format!("http://user:secret@{proxy}"));
        std::env::set_var("HTTPS_PROXY", format!("http://user:secret@{proxy}"));
        std::env::set_var("NO_PROXY", "127.0.0.1,localhost");
        let direct = MockUpstream::start().await;
        let toml = format!(
            "[[upstreams]]\nname = \"plain\"\nbase_url = \"http://upstream.recall.test/v1\"\nmodels = [\"plain-*\"]\n\
             [[upstreams]]\nname = \"secure\"\nbase_url = \"https://secure.recall.test/v1\"\nmodels = [\"secure-*\"]\n\
             [[upstreams]]\nname = \"direct\"\nbase_url = \"{}\"\nmodels = [\"*\"]\n",
            direct.base_url()
        );
        let h = Harness::with_config(&toml, direct).await;

        // Plain HTTP: forwarded in absolute form, with the proxy's
        // credentials and recall's user agent.
        let (status, body) = h
            .chat(Some("p"), json!({"model": "plain-1", "messages": [user("hi")]}))
            .await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["choices"][0]["message"]["content"], "via the proxy");
        let head = heads.lock().unwrap().pop().unwrap().to_ascii_lowercase();
        assert!(
            head.starts_with("post http://upstream.recall.test/v1/chat/completions http/1.1\r\n"),
            "{head}"
        );
        assert!(head.contains("\r\nhost: upstream.recall.test\r\n"), "{head}");
        // base64("user:secret")
        assert!(head.contains("\r\nproxy-authorization: basic dxnlcjpzzwnyzxq=\r\n"), "{head}");
        let agent = format!("\r\nuser-agent: recall/{}\r\n", env!("CARGO_PKG_VERSION"));
        assert!(head.contains(&agent), "{head}");

        // HTTPS: a CONNECT tunnel, with the credentials on the CONNECT;
        // TLS inside it meets the untrusted certificate behind the proxy.
        let (status, body) = h
            .chat(Some("s"), json!({"model": "secure-1", "messages": [user("hi")]}))
            .await;
        assert_eq!(status, 502, "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains("invalid peer certificate"), "{message}");
        let head = heads.lock().unwrap().pop().unwrap().to_ascii_lowercase();
        assert!(
            head.starts_with("connect secure.recall.test:443 http/1.1\r\n"),
            "{head}"
        );
        assert!(head.contains("\r\nproxy-authorization: basic dxnlcjpzzwnyzxq=\r\n"), "{head}");
        assert!(head.contains(&agent), "{head}");

        // NO_PROXY: the loopback upstream is called directly.
        h.upstream.push(completion("direct"));
        let (status, body) = h
            .chat(Some("d"), json!({"model": "other", "messages": [user("hi")]}))
            .await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["choices"][0]["message"]["content"], "direct");
        assert!(heads.lock().unwrap().is_empty());
    });
}
