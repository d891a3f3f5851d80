//! One forwarded connection: bytes copied both ways between the client and its node until both end.
//!
//! ```text
//! client ──copy──► node     EOF ─► shut down writing to the node (the node sees the client's FIN)
//! client ◄──copy── node     EOF ─► shut down writing to the client
//! an error either way ─► both connections shut down (each side sees its connection end) ─► Piped.error
//! ```
//!
//! A connection stays on the node it was forwarded to until it ends, whatever the node's health says
//! later: that is what lets a leaving node's existing connections drain.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};

/// How a forwarded connection ended.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Piped {
    /// Bytes the client sent to the node.
    pub to_node: u64,
    /// Bytes the node sent to the client.
    pub to_client: u64,
    /// What broke it, if something did.
    pub error: Option<String>,
}

/// Copies both ways until both directions end; returns the counts.
pub fn pipe(client: TcpStream, node: TcpStream) -> Piped {
    let clones = (client.try_clone(), node.try_clone());
    let (Ok(client_reader), Ok(node_writer)) = clones else {
        let _ = client.shutdown(Shutdown::Both);
        let _ = node.shutdown(Shutdown::Both);
        return Piped {
            error: Some("could not share the sockets between two threads".into()),
            ..Piped::default()
        };
    };
    let upstream = std::thread::spawn(move || copy(client_reader, node_writer));
    let to_client = copy(node, client);
    // NB: a thread that panicked copied nothing we can count; its error is the panic.
    let to_node = upstream
        .join()
        .unwrap_or_else(|_| (0, Some("the copying thread panicked".into())));
    Piped {
        to_node: to_node.0,
        to_client: to_client.0,
        error: to_node.1.or(to_client.1),
    }
}

/// Copies `from` into `to` until `from` ends; bytes copied, and the error that stopped it.
fn copy(mut from: TcpStream, mut to: TcpStream) -> (u64, Option<String>) {
    let mut buffer = [0u8; 16 * 1024];
    let mut copied = 0u64;
    loop {
        let n = match from.read(&mut buffer) {
            Ok(0) => {
                let _ = to.shutdown(Shutdown::Write);
                return (copied, None);
            }
            Ok(n) => n,
            Err(error) => return (copied, Some(fail(&from, &to, "reading", &error))),
        };
        if let Err(error) = to.write_all(&buffer[..n]) {
            return (copied, Some(fail(&from, &to, "writing", &error)));
        }
        copied += n as u64;
    }
}

/// Ends both connections, so the other direction's copy ends too and each peer sees it.
fn fail(from: &TcpStream, to: &TcpStream, doing: &str, error: &std::io::Error) -> String {
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
    format!("{doing}: {error}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// Loopback: an echo "node" behind the pipe; the client's bytes come back, both ends close.
    #[test]
    fn bytes_flow_both_ways_and_each_end_is_passed_on() {
        let node = TcpListener::bind("127.0.0.1:0").unwrap();
        let node_addr = node.local_addr().unwrap();
        std::thread::spawn(move || {
            let (mut stream, _) = node.accept().unwrap();
            let mut buffer = [0u8; 64];
            loop {
                match stream.read(&mut buffer) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => stream.write_all(&buffer[..n]).unwrap(),
                }
            }
        });
        let front = TcpListener::bind("127.0.0.1:0").unwrap();
        let front_addr = front.local_addr().unwrap();
        let piping = std::thread::spawn(move || {
            let (client, _) = front.accept().unwrap();
            pipe(client, TcpStream::connect(node_addr).unwrap())
        });
        let mut client = TcpStream::connect(front_addr).unwrap();
        client.write_all(b"hello").unwrap();
        let mut echoed = [0u8; 5];
        client.read_exact(&mut echoed).unwrap();
        assert_eq!(&echoed, b"hello");
        client.shutdown(Shutdown::Write).unwrap();
        let mut rest = Vec::new();
        client.read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty());
        assert_eq!(
            piping.join().unwrap(),
            Piped {
                to_node: 5,
                to_client: 5,
                error: None
            }
        );
    }
}
