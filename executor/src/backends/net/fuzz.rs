//! The frame parser's fuzz entry point ([`fuzz_frames`]) and its seeds ([`frame_seeds`]).

use super::proto::{self, Header, Tag};
use super::pump::{Pumped, pump_from};
use super::stream::{Recv, RxState};
use super::{ALIVE, Inner, Peer};
use crate::arena::Arena;
use crate::transport::Dir;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Bytes in memory as a peer's stream ([`fuzz_frames`]): served `chunk` bytes at a time,
/// with nothing there on every `block`-th read (from the second read on; `0`: never).
struct Bytes<'a> {
    data: &'a [u8],
    pos: std::cell::Cell<usize>,
    reads: std::cell::Cell<usize>,
    chunk: usize,
    block: usize,
}

impl Recv for Bytes<'_> {
    fn recv(&self, buf: &mut [u8]) -> std::io::Result<Option<usize>> {
        let reads = self.reads.get() + 1;
        self.reads.set(reads);
        let pos = self.pos.get();
        if pos < self.data.len() && self.block > 1 && reads.is_multiple_of(self.block) {
            return Ok(None);
        }
        let n = buf.len().min(self.chunk).min(self.data.len() - pos);
        buf[..n].copy_from_slice(&self.data[pos..pos + n]);
        self.pos.set(pos + n);
        Ok(Some(n))
    }
    fn shutdown_write(&self) {}
}

/// Feeds `input` to the frame parser of a rank 1 of 2 whose peer is rank 0, as bytes that
/// peer sent (the fuzzing entry point, `hccl_executor::fuzz::frames`). The first byte
/// chooses how the stream is read (bytes per read, reads that find nothing) and how many
/// sockets the ranks use; the rest is the stream. Between pumps the local receiver frees
/// every published message, so well-formed streams can go on past the credit window.
///
/// Returns how the stream ended: `Ok` after a goodbye, else the parser's complaint (an
/// empty input is `Ok`). Panics when the parser breaks an invariant: a message published
/// outside the credit window, a credit for more messages than this rank sent (4), a byte
/// written outside the slots of the connections the peer sends on, or a pump that neither
/// reads nor ends.
pub(crate) fn fuzz_frames(input: &[u8]) -> std::result::Result<(), String> {
    use crate::arena::Layout;
    const SLOT: usize = 4096;
    let Some((&config, stream)) = input.split_first() else {
        return Ok(());
    };
    let chunk = [1, 7, 32, 4096, usize::MAX][usize::from(config & 7) % 5];
    let block = usize::from(config >> 3 & 3);
    let nsocks = 1 + usize::from(config >> 5 & 3);
    // Connections 1 and 3 come from rank 0 (channels 5 and 7), 2 goes to it (channel 3), 0
    // and 4 stay on this host: their slots, around the others, must stay untouched.
    let dirs = vec![Dir::Local, Dir::In(0), Dir::Out(0), Dir::In(0), Dir::Local];
    let Some(arena) = Arena::heap(Layout::new(2, dirs.len(), SLOT)) else {
        return Err("no memory for the arena".into());
    };
    let inner = Inner::new(
        (1, 2),
        vec!["h0".into(), "h1".into()],
        Arc::new(arena),
        vec![Peer {
            rank: 0,
            host: "h0".into(),
            addr: "127.0.0.1:1".into(),
            socks: Vec::new(),
            state: AtomicU8::new(ALIVE),
            reason: Mutex::new(String::new()),
            last_recv: AtomicU64::new(0),
        }],
        dirs,
        vec![0, 5, 3, 7, 1],
        (SLOT, nsocks, false),
        Duration::from_secs(10),
    );
    // This rank has sent 4 messages on connection 2: credits up to 4 are well-formed.
    const SENT: u64 = 4;
    inner.sent_out[2].store(SENT, Ordering::Release);
    let src = Bytes {
        data: stream,
        pos: std::cell::Cell::new(0),
        reads: std::cell::Cell::new(0),
        chunk,
        block,
    };
    let mut rx = RxState::default();
    let mut idle = 0usize;
    let end = loop {
        let before = src.pos.get();
        let res = pump_from(&inner, 0, &src, &mut rx);
        for c in [1u32, 3] {
            let sent = inner.arena.sent(c).load(Ordering::Acquire);
            let consumed = inner.arena.consumed(c).load(Ordering::Acquire);
            assert!(
                sent <= consumed + inner.window as u64,
                "connection {c}: {sent} messages published, {consumed} consumed"
            );
            // The local receiver frees what was published.
            inner.arena.consumed(c).store(sent, Ordering::Release);
        }
        let credited = inner.arena.consumed(2).load(Ordering::Acquire);
        assert!(
            credited <= SENT,
            "a credit for {credited} messages on a connection that sent {SENT}"
        );
        match res {
            Ok(Pumped::Closed) => break Ok(()),
            Err(why) => break Err(why),
            Ok(Pumped::Idle | Pumped::Progress) => {
                if src.pos.get() == before {
                    idle += 1;
                    assert!(idle <= 4, "the pump neither reads nor ends");
                } else {
                    idle = 0;
                }
            }
        }
    };
    for c in [0u32, 2, 4] {
        for seq in 0..hccl_ir::CONNECTION_SLOTS as u64 {
            // SAFETY: a slot is SLOT bytes of the heap arena, and nothing writes it now.
            let slot = unsafe { std::slice::from_raw_parts(inner.arena.slot(c, seq), SLOT) };
            assert!(
                slot.iter().all(|&b| b == 0),
                "bytes from the network landed in a slot of connection {c}"
            );
        }
    }
    end
}

/// Well-formed streams for [`fuzz_frames`] (behind their first byte): seeds for the fuzzer.
pub(crate) fn frame_seeds() -> Vec<Vec<u8>> {
    fn part(
        channel: u32,
        seq: u64,
        (parts, flags): (u32, u8),
        segs: &[(u32, u32)],
        call: Option<(u64, u64)>,
    ) -> Vec<u8> {
        let payload: Vec<u8> = segs
            .iter()
            .flat_map(|&(off, len)| (0..len).map(move |i| (off + i) as u8 | 1))
            .collect();
        let mut h = Header::new(Tag::Data);
        h.flags = flags;
        h.conn = channel;
        h.seq = seq;
        h.a = parts;
        h.b = segs.len() as u32;
        h.c = payload.len() as u32;
        let mut out = h.encode().to_vec();
        for (o, l) in segs {
            out.extend_from_slice(&o.to_le_bytes());
            out.extend_from_slice(&l.to_le_bytes());
        }
        out.extend_from_slice(&payload);
        if flags & proto::FLAG_CRC != 0 {
            out.extend_from_slice(&crc32c::crc32c(&payload).to_le_bytes());
        }
        if let Some((number, print)) = call {
            out.extend_from_slice(&number.to_le_bytes());
            out.extend_from_slice(&print.to_le_bytes());
        }
        out
    }
    let frame = |tag: Tag, conn: u32, seq: u64, (a, b): (u32, u32)| {
        let mut h = Header::new(tag);
        h.conn = conn;
        h.seq = seq;
        h.a = a;
        h.b = b;
        h.encode().to_vec()
    };
    let goodbye = frame(Tag::Goodbye, 0, 0, (0, 0));
    // First bytes: one read for everything and one socket; one byte per read, every other
    // read finding nothing, two sockets.
    let (whole, trickle) = (4u8, 2 << 3 | 1 << 5);
    let mut plain = part(5, 0, (1, 0), &[(0, 4), (64, 4)], None);
    plain.extend(part(5, 1, (1, 0), &[], None));
    plain.extend(frame(Tag::Credit, 3, 3, (0, 0)));
    plain.extend(frame(Tag::Heartbeat, 0, 0, (0, 0)));
    plain.extend(&goodbye);
    let mut checked = Vec::new();
    let both = proto::FLAG_CRC | proto::FLAG_CALL;
    // Two messages: the window the peer may fill before it hears of a freed slot.
    for seq in 0..2 {
        checked.extend(part(
            7,
            seq,
            (1, both),
            &[(0, 40), (128, 24)],
            Some((seq + 1, 0xabcd)),
        ));
    }
    checked.extend(part(5, 0, (1, proto::FLAG_CRC), &[(8, 16)], None));
    checked.extend(frame(Tag::Abort, 0, 0, (0, 1)));
    checked.extend(&goodbye);
    let mut split = part(5, 0, (2, 0), &[(0, 100)], None);
    split.extend(part(7, 0, (1, proto::FLAG_CALL), &[(0, 8)], Some((1, 2))));
    split.extend(part(5, 0, (2, 0), &[(100, 50), (4000, 96)], None));
    split.extend(&goodbye);
    let with = |first: u8, body: &[u8]| {
        let mut v = vec![first];
        v.extend_from_slice(body);
        v
    };
    vec![
        with(whole, &plain),
        with(trickle, &plain),
        with(whole, &checked),
        with(trickle, &checked),
        with(trickle, &split),
        with(whole | 1 << 5, &split[..split.len() - 40]),
    ]
}
