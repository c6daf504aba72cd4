//! What a transport between hosts provides the replay engine and the communicator: the core
//! names no transport, it drives one through [`Transport`] (the network backend implements
//! it for TCP and RDMA).
//!
//! The engine calls a transport only for connections whose other end is on another host
//! (their [`Dir`] is not [`Dir::Local`]) and when a rank waits, the communicator at the
//! boundaries of a call; a step on a connection within the host never reaches it, and a
//! group on one host has no transport at all. What those calls do (write or read a socket,
//! take a lock, update a word other threads poll) costs more than the one indirect call
//! through `dyn Transport`.

use hccl_ir::CONNECTION_SLOTS;
use std::sync::atomic::AtomicU64;

/// How a connection of the plan relates to this rank's network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dir {
    /// Both ends on this host, or not this rank's connection.
    Local,
    /// This rank sends to the peer with this index.
    Out(u16),
    /// This rank receives from the peer with this index.
    In(u16),
}

/// A piece of a message: `len` bytes at `ptr` that land at `off` in the receiver's slot.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Seg {
    pub off: usize,
    pub ptr: *const u8,
    pub len: usize,
}

// SAFETY: a `Seg` is only dereferenced while the engine that made it waits for the send to
// finish, and the memory it points to is not written meanwhile.
unsafe impl Send for Seg {}

/// Where a published message from another host lies when the transport keeps it in its
/// own memory rather than in the connection's slot of the shared region, and what came
/// with it: the checksum mark word ([`crate::arena::corrupt_mark`] when a part failed its
/// check) and the sender's call (number, fingerprint; number 0: none sent).
pub(crate) struct Landed<'a> {
    pub data: *const u8,
    pub crc: &'a AtomicU64,
    pub call: (&'a AtomicU64, &'a AtomicU64),
}

/// A transport between hosts: how the engine sends a message, hands back a credit and
/// reads what arrived, and what the communicator learns from it about peers on other hosts.
pub(crate) trait Transport: Send + Sync {
    /// How each connection of the plan relates to the network.
    fn dirs(&self) -> &[Dir];

    /// Sends message `seq` of connection `c` (whose direction is `Out`), made of `segs`,
    /// under the sender's call `call` (its number and fingerprint). Returns when the bytes
    /// are with the transport; a failure marks the peer failed and raises the abort word
    /// (the engine reports it at its next wait).
    fn send(&self, c: u32, seq: u64, segs: &[Seg], call: Option<(u64, u64)>);

    /// Messages a connection to another host may have in flight (sent, not yet credited):
    /// [`CONNECTION_SLOTS`] or more. Deeper windows only buffer more, which for the IR's
    /// determinate programs can remove waits but never add one.
    fn window(&self) -> u64 {
        CONNECTION_SLOTS as u64
    }

    /// Where published message `seq` of connection `c` (direction `In`) lies, when not in
    /// the connection's slot of the shared region.
    fn landed(&self, _c: u32, _seq: u64) -> Option<Landed<'_>> {
        None
    }

    /// Message `seq` of connection `c` (direction `In`) has not arrived, and the step that
    /// will receive it copies it without reducing: the bytes at `off..off + len` of the
    /// message may be written straight to `ptr` of each of `ranges` (sorted by `off`)
    /// instead of its slot. `ranges` must stay valid, and be touched by nothing else, until
    /// [`Transport::take_post`] or the call's end. Whether the transport took the offer (it
    /// declines when the message has begun to arrive).
    fn post(&self, _c: u32, _seq: u64, _ranges: Vec<Seg>) -> bool {
        false
    }

    /// Withdraws the post of message `seq` of `c`, now published: whether the message was
    /// written to the posted ranges (then nothing of it is in its slot).
    fn take_post(&self, _c: u32, _seq: u64) -> bool {
        false
    }

    /// Records that `consumed` messages of connection `c` (direction `In`) are consumed: the
    /// credit travels to the sender.
    fn credit(&self, c: u32, consumed: u64);

    /// This rank cannot make progress: hand over what peers may wait for (credits) and read
    /// what they sent.
    fn on_wait(&self);

    /// Reads whatever the peer of connection `c` has sent, without blocking.
    fn poll(&self, c: u32);

    /// A call failed: tell the other hosts now.
    fn forward_abort(&self);

    /// The first failed send since the last call of this, if any: the peer and why.
    fn take_send_failure(&self) -> Option<(u32, String)>;

    /// A collective call starts: its engine reads the transport from now on.
    fn begin_call(&self);

    /// The call ended (also when it failed): withdraws every post, after which nothing is
    /// written to the memory they named.
    fn end_call(&self);

    /// `None` while `rank` (on another host) is alive, else why it is not. Before it says
    /// so, what the peer sent (and this host received) is taken in: a message it sent
    /// before it exited completes the wait that asks.
    fn peer_failure(&self, rank: u32) -> Option<String>;

    /// The host identity of `rank`.
    fn host_of(&self, rank: u32) -> &str;
}
