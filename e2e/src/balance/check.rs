//! One HTTP health check, as a cloud load balancer makes it: connect, `GET path`, read the status line.
//!
//! ```text
//! get_status(node:10256, "/healthz", timeout) ─► TCP connect ─► "GET /healthz HTTP/1.1" (Connection: close)
//!   ─► the first line of the answer ─► status_code() ─► Answer::Status(200 | 503 | …)
//!   any failure or timeout ─► Answer::Unreachable(why)
//! ```
//!
//! Only the status code counts (the body is kube-proxy's JSON, for people). Tests use the same call to
//! watch a node's `/healthz` and `/livez` from outside.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use super::pool::Answer;

/// The most of an answer read before its status line must have ended.
const HEAD_LIMIT: usize = 1024;

/// `GET path` on `addr`; the whole exchange takes at most `timeout`.
pub fn get_status(addr: SocketAddr, path: &str, timeout: Duration) -> Answer {
    let deadline = Instant::now() + timeout;
    let left = || {
        deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1))
    };
    let exchange = || -> std::io::Result<String> {
        let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
        stream.set_write_timeout(Some(left()))?;
        let request = format!(
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: switchyard-lab-balancer\r\nConnection: close\r\n\r\n"
        );
        stream.write_all(request.as_bytes())?;
        let mut head = Vec::new();
        let mut buffer = [0u8; 256];
        while !head.contains(&b'\n') && head.len() < HEAD_LIMIT {
            stream.set_read_timeout(Some(left()))?;
            let n = stream.read(&mut buffer)?;
            if n == 0 {
                break;
            }
            head.extend_from_slice(&buffer[..n]);
        }
        Ok(String::from_utf8_lossy(&head).into_owned())
    };
    match exchange() {
        Ok(head) => match status_code(&head) {
            Some(code) => Answer::Status(code),
            None => Answer::Unreachable(format!("not an HTTP answer: {:?}", first_line(&head))),
        },
        Err(error) => Answer::Unreachable(error.to_string()),
    }
}

fn first_line(head: &str) -> &str {
    head.lines().next().unwrap_or_default()
}

/// The status code of an answer's first line (`HTTP/1.1 503 Service Unavailable`).
fn status_code(head: &str) -> Option<u16> {
    let line = head.split_once('\n').map(|(line, _)| line)?;
    let mut words = line.split_whitespace();
    let version = words.next()?;
    if !version.starts_with("HTTP/") {
        return None;
    }
    words.next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn only_a_complete_status_line_gives_a_code() {
        assert_eq!(status_code("HTTP/1.1 503 Service Unavailable\r\nx"), Some(503));
        assert_eq!(status_code("HTTP/1.0 200 OK\n"), Some(200));
        assert_eq!(status_code("HTTP/1.1 200 OK"), None, "the line has not ended");
        assert_eq!(status_code("SSH-2.0-OpenSSH\r\n"), None);
        assert_eq!(status_code("HTTP/1.1 abc\r\n"), None);
    }

    /// Loopback, no namespaces: a server that answers 503, one that hangs, and a closed port.
    #[test]
    fn a_check_reads_the_code_or_says_why_there_is_none() {
        let answering = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = answering.local_addr().unwrap();
        std::thread::spawn(move || {
            for stream in answering.incoming() {
                let mut stream = stream.unwrap();
                let mut request = [0u8; 512];
                let _ = stream.read(&mut request);
                let _ = stream.write_all(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n");
            }
        });
        let timeout = Duration::from_secs(2);
        assert_eq!(get_status(addr, "/healthz", timeout), Answer::Status(503));

        let silent = TcpListener::bind("127.0.0.1:0").unwrap();
        let started = Instant::now();
        let answer = get_status(
            silent.local_addr().unwrap(),
            "/healthz",
            Duration::from_millis(200),
        );
        assert!(matches!(answer, Answer::Unreachable(_)), "{answer:?}");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "the timeout bounds a check"
        );

        let closed = silent.local_addr().unwrap();
        drop(silent);
        assert!(!get_status(closed, "/healthz", timeout).is_healthy());
    }
}
