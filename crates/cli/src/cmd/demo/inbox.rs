//! The demo's receivers: one local HTTP listener standing for the on-call's webhook and a
//! consumer's, so the demo shows what they are told without leaving the machine. Each POST's
//! path (the receiver) and JSON body are kept; every request is answered 200. A few lines of
//! HTTP/1.1, enough for reqwest's POSTs, are the whole server.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use serde_json::Value;

/// The listener's address and what it was sent.
pub struct Inbox {
    /// `http://127.0.0.1:PORT`: receivers' URLs are this plus `/NAME`.
    pub url: String,
    received: Arc<Mutex<Vec<(String, Value)>>>,
}

impl Inbox {
    /// Listens on a free local port, in a thread of its own for as long as the demo runs.
    pub fn start() -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").context("opening the demo's local receiver")?;
        let url = format!("http://{}", listener.local_addr()?);
        let received = Arc::new(Mutex::new(Vec::new()));
        let kept = received.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                if let Some(message) = read(stream) {
                    kept.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(message);
                }
            }
        });
        Ok(Self { url, received })
    }

    /// What `receiver` was sent so far, oldest first.
    pub fn of(&self, receiver: &str) -> Vec<Value> {
        let path = format!("/{receiver}");
        let all = self.received.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        all.iter().filter(|(p, _)| *p == path).map(|(_, body)| body.clone()).collect()
    }
}

/// One request's path and JSON body, answered 200.
fn read(mut stream: TcpStream) -> Option<(String, Value)> {
    let mut reader = BufReader::new(stream.try_clone().ok()?);
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let path = line.split_whitespace().nth(1)?.to_owned();
    let mut length = 0usize;
    loop {
        let mut header = String::new();
        reader.read_line(&mut header).ok()?;
        let header = header.trim_end();
        if header.is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse().ok()?;
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    stream.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n").ok()?;
    Some((path, serde_json::from_slice(&body).ok()?))
}
