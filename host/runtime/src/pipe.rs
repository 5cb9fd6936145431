//! A capped in-memory stdout/stderr for guests: keeps the first bytes, drops the rest.
//!
//! wasmtime-wasi's `MemoryOutputPipe` reports an error once full, which makes a
//! Rust guest's `println!` panic; a chatty handler must not fail because of that.

use hourglass_task::sync::LockExt;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};

/// Everything a guest wrote to one stream, up to `cap` bytes.
#[derive(Debug, Clone)]
pub(crate) struct CappedPipe {
    inner: Arc<Mutex<Captured>>,
}

#[derive(Debug, Default)]
struct Captured {
    bytes: Vec<u8>,
    cap: usize,
    dropped: usize,
}

impl CappedPipe {
    pub(crate) fn new(cap: usize) -> CappedPipe {
        CappedPipe { inner: Arc::new(Mutex::new(Captured { cap, ..Captured::default() })) }
    }

    fn push(&self, data: &[u8]) {
        let mut c = self.inner.lock_unpoisoned();
        let room = c.cap.saturating_sub(c.bytes.len());
        let keep = room.min(data.len());
        c.bytes.extend_from_slice(&data[..keep]);
        c.dropped += data.len() - keep;
    }

    /// The captured text (lossy) and how many bytes were dropped over the cap.
    pub(crate) fn take(&self) -> (String, usize) {
        let mut c = self.inner.lock_unpoisoned();
        let text = String::from_utf8_lossy(&c.bytes).into_owned();
        c.bytes.clear();
        (text, std::mem::take(&mut c.dropped))
    }
}

impl IsTerminal for CappedPipe {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for CappedPipe {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for CappedPipe {
    async fn ready(&mut self) {}
}

impl OutputStream for CappedPipe {
    fn write(&mut self, bytes: bytes::Bytes) -> StreamResult<()> {
        self.push(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        // Always accept: excess output is dropped, never an error for the guest.
        Ok(64 * 1024)
    }
}

impl tokio::io::AsyncWrite for CappedPipe {
    fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        self.push(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}
