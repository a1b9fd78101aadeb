//! An upstream written at the socket: what it sends, and when, is exactly
//! what a test scripts (bursts, pauses, a connection that just closes).

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// An upstream that answers in pieces, each a list of SSE events written
/// in one write after its pause, as HTTP chunks of one event each. With
/// `end`, the body's last chunk follows; without, the connection just
/// closes (an upstream that crashed).
pub async fn burst_upstream(pieces: Vec<(Duration, Vec<String>)>, end: bool) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let pieces = pieces.clone();
            tokio::spawn(async move {
                let (mut buf, mut got) = (vec![0u8; 65536], Vec::new());
                // The request: its head, then content-length bytes of body.
                loop {
                    match conn.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                    let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") else {
                        continue;
                    };
                    let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
                    let len = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length: "))
                        .and_then(|v| v.trim().parse::<usize>().ok())
                        .unwrap_or(0);
                    if got.len() >= end + 4 + len {
                        break;
                    }
                }
                let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
                            transfer-encoding: chunked\r\n\r\n";
                let _ = conn.write_all(head.as_bytes()).await;
                let last = pieces.len() - 1;
                for (i, (pause, events)) in pieces.into_iter().enumerate() {
                    tokio::time::sleep(pause).await;
                    let mut out = String::new();
                    for e in events {
                        out.push_str(&format!("{:x}\r\n{e}\r\n", e.len()));
                    }
                    if i == last && end {
                        out.push_str("0\r\n\r\n");
                    }
                    let _ = conn.write_all(out.as_bytes()).await;
                }
            });
        }
    });
    addr
}
