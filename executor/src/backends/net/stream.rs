//! The parse state of one incoming socket ([`RxState`]: the stage of the frame being read
//! and the bytes read ahead), and where the bytes come from ([`Recv`]: a socket, or memory
//! in the fuzz target).

use super::proto::{self, Header};
use crate::transport::Seg;
use std::net::{Shutdown, TcpStream};

/// Where a socket's incoming byte stream stands (partial frames survive between pumps).
#[derive(Debug)]
pub(super) struct RxState {
    pub(super) stage: Stage,
    pub(super) hdr: [u8; proto::HEADER],
    pub(super) got: usize,
    pub(super) said_goodbye: bool,
    pub(super) ahead: ReadAhead,
}

impl Default for RxState {
    fn default() -> RxState {
        RxState {
            stage: Stage::Header,
            hdr: [0; proto::HEADER],
            got: 0,
            said_goodbye: false,
            ahead: ReadAhead::default(),
        }
    }
}

/// Bytes read from a socket ahead of the parser, so that a small message (header, segment
/// table and payload) costs one `recv` instead of three. Reads of [`READ_AHEAD`] bytes or
/// more go straight to their destination.
#[derive(Debug, Default)]
pub(super) struct ReadAhead {
    buf: Vec<u8>,
    pos: usize,
}

const READ_AHEAD: usize = 16 * 1024;

/// Where a pump's bytes come from: a peer's socket, or (fuzzing, tests) bytes in memory.
pub(crate) trait Recv {
    /// Like [`recv_now`]: `Ok(None)` when nothing is there now, `Ok(Some(0))` at the end.
    fn recv(&self, buf: &mut [u8]) -> std::io::Result<Option<usize>>;
    /// The peer said goodbye: this side will write nothing more either.
    fn shutdown_write(&self);
}

impl Recv for TcpStream {
    fn recv(&self, buf: &mut [u8]) -> std::io::Result<Option<usize>> {
        recv_now(self, buf)
    }
    fn shutdown_write(&self) {
        let _ = self.shutdown(Shutdown::Write);
    }
}

impl ReadAhead {
    /// Like [`recv_now`], served from the bytes read ahead first.
    pub(super) fn read(
        &mut self,
        sock: &impl Recv,
        dst: &mut [u8],
    ) -> std::io::Result<Option<usize>> {
        if self.pos == self.buf.len() && !dst.is_empty() {
            if dst.len() >= READ_AHEAD {
                return sock.recv(dst);
            }
            self.buf.resize(READ_AHEAD, 0);
            self.pos = 0;
            match sock.recv(&mut self.buf) {
                Ok(Some(n)) => self.buf.truncate(n),
                other => {
                    self.buf.clear();
                    return other;
                }
            }
            if self.buf.is_empty() {
                return Ok(Some(0));
            }
        }
        let n = dst.len().min(self.buf.len() - self.pos);
        dst[..n].copy_from_slice(&self.buf[self.pos..self.pos + n]);
        self.pos += n;
        Ok(Some(n))
    }
}

#[derive(Debug)]
pub(super) enum Stage {
    Header,
    Table(Header, Vec<u8>),
    /// Data part: header, segments, current segment, bytes of it already read, the CRC32C
    /// of the payload so far, the receiving step's destinations (`proto::Inbound::post`;
    /// empty: everything lands in the slot).
    Payload(Header, Vec<(u32, u32)>, usize, usize, u32, Vec<Seg>),
    /// What follows a data part's payload ([`proto::trailer_len`]): header, the payload's
    /// CRC32C as received, the trailer's bytes so far.
    Trailer(Header, u32, [u8; proto::MAX_TRAILER], usize),
    Closed,
}

/// Non-blocking receive into `buf`: `Ok(None)` when nothing is there now, `Ok(Some(0))` at
/// the end of the stream.
pub(super) fn recv_now(sock: &TcpStream, buf: &mut [u8]) -> std::io::Result<Option<usize>> {
    use std::os::fd::AsRawFd;
    loop {
        // SAFETY: `buf` is valid for writes of its length; the descriptor is open for as
        // long as `sock` lives.
        let n = unsafe {
            libc::recv(
                sock.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if n >= 0 {
            return Ok(Some(n as usize));
        }
        let e = std::io::Error::last_os_error();
        match e.kind() {
            std::io::ErrorKind::WouldBlock => return Ok(None),
            std::io::ErrorKind::Interrupted => continue,
            _ => return Err(e),
        }
    }
}

/// Whether `sock` has bytes to read (or an end of stream) right now.
pub(super) fn bytes_waiting(sock: &TcpStream) -> bool {
    use std::os::fd::AsRawFd;
    let mut b = [0u8; 1];
    // SAFETY: a one-byte buffer; the descriptor is open while `sock` lives.
    let n = unsafe {
        libc::recv(
            sock.as_raw_fd(),
            b.as_mut_ptr().cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    n > 0
}
