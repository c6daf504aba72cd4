use super::fuzz::{frame_seeds, fuzz_frames};
use super::pump::*;
use super::setup::*;
use super::stream::*;
use super::*;
use crate::arena::Layout;
use crate::program::ConnTable;
use std::io::Read;
use std::net::{Shutdown, TcpListener};

const SLOT: usize = 4096;

fn pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (b, _) = l.accept().unwrap();
    (a, b)
}

/// A rank 1 whose only peer is rank 0, reached through `sock`; connection 0 goes to
/// rank 0, connection 1 comes from it.
fn inner_with(sock: TcpStream) -> Arc<Inner> {
    let arena = Arc::new(Arena::heap(Layout::new(2, 2, SLOT)).expect("heap arena"));
    let write = sock.try_clone().unwrap();
    Arc::new(Inner::new(
        (1, 2),
        vec!["h0".into(), "h1".into()],
        arena,
        vec![Peer {
            rank: 0,
            host: "h0".into(),
            addr: "127.0.0.1:1".into(),
            socks: vec![Sock {
                read: sock,
                write: Mutex::new(write),
                rx: Mutex::new(RxState::default()),
            }],
            state: AtomicU8::new(ALIVE),
            reason: Mutex::new(String::new()),
            last_recv: AtomicU64::new(0),
        }],
        vec![Dir::Out(0), Dir::In(0)],
        // Connection 0 on channel 3, connection 1 on channel 5 (what frames name).
        vec![3, 5],
        (SLOT, 1, false),
        Duration::from_secs(10),
    ))
}

fn data(conn: u32, seq: u64, segs: &[(u32, u32)]) -> Vec<u8> {
    let mut h = Header::new(Tag::Data);
    h.conn = conn;
    h.seq = seq;
    h.a = 1;
    h.b = segs.len() as u32;
    h.c = segs.iter().map(|s| s.1).sum();
    let mut out = h.encode().to_vec();
    for (o, l) in segs {
        out.extend_from_slice(&o.to_le_bytes());
        out.extend_from_slice(&l.to_le_bytes());
    }
    out
}

/// The bytes of the slot message `seq` of incoming connection `c` lands in (its inbox's),
/// after checking that nothing from the network reached the shared region's slot.
fn slot_bytes(inner: &Inner, c: u32, seq: u64) -> Vec<u8> {
    // SAFETY: both slots are SLOT bytes (the heap arena's, the inbox's); no thread writes
    // them any more.
    let (arena, inbox) = unsafe {
        (
            std::slice::from_raw_parts(inner.arena.slot(c, seq), SLOT),
            std::slice::from_raw_parts(inner.in_slot(c, seq), SLOT),
        )
    };
    assert!(
        arena.iter().all(|&b| b == 0),
        "the network wrote the shared slot"
    );
    inbox.to_vec()
}

/// Feeds `bytes` (then closes, unless `keep_open`) to a receiving thread and returns
/// the peer's state and reason once it stopped.
fn feed(bytes: &[u8]) -> (Arc<Inner>, u8, String) {
    feed_after(bytes, 0)
}

/// [`feed`] to a rank that has sent `sent` messages on connection 0.
fn feed_after(bytes: &[u8], sent: u64) -> (Arc<Inner>, u8, String) {
    let (mut attacker, ours) = pair();
    let inner = inner_with(ours);
    inner.sent_out[0].store(sent, Ordering::Release);
    let t = {
        let inner = Arc::clone(&inner);
        std::thread::spawn(move || receive_loop(&inner, 0, 0))
    };
    attacker.write_all(bytes).unwrap();
    drop(attacker);
    t.join().unwrap();
    let state = inner.peers[0].state.load(Ordering::Acquire);
    let reason = inner.peers[0].reason.lock().unwrap().clone();
    (inner, state, reason)
}

#[test]
fn malformed_frames_close_the_connection_and_never_touch_a_slot() {
    let mut header_then_short = data(5, 0, &[(0, 64)]);
    header_then_short.extend_from_slice(&[7u8; 10]);
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("garbage", vec![0xAB; 40], "malformed frame"),
        (
            "wrong direction",
            data(3, 0, &[(0, 8)]),
            "channel 3, where it has no connection to this rank",
        ),
        ("unknown connection", data(9, 0, &[(0, 8)]), "channel 9"),
        (
            "segment past the slot",
            data(5, 0, &[(SLOT as u32 - 8, 64)]),
            "outside",
        ),
        (
            "outside the credit window",
            data(5, inbox::window(SLOT) as u64, &[(0, 8)]),
            "credit window",
        ),
        (
            "too many segments",
            {
                let mut h = Header::new(Tag::Data);
                h.conn = 5;
                h.a = 1;
                h.b = proto::MAX_SEGS + 1;
                h.encode().to_vec()
            },
            "segments",
        ),
        (
            "closed mid-message",
            header_then_short,
            "middle of a message",
        ),
        (
            "closed without goodbye",
            Vec::new(),
            "without saying goodbye",
        ),
    ];
    for (what, bytes, want) in cases {
        let (inner, state, reason) = feed(&bytes);
        assert_eq!(state, DEAD, "{what}: {reason}");
        assert!(reason.contains(want), "{what}: {reason}");
        assert!(reason.contains("rank 0 on host h0"), "{what}: {reason}");
        assert_eq!(
            inner.arena.abort().load(Ordering::Acquire),
            0,
            "{what}: a waiting rank reports it, not the receiver"
        );
        assert_eq!(
            inner.arena.sent(1).load(Ordering::Acquire),
            0,
            "{what}: nothing published"
        );
        if want != "middle of a message" {
            assert!(
                slot_bytes(&inner, 1, 0).iter().all(|&b| b == 0),
                "{what}: slot untouched"
            );
        }
    }
}

#[test]
fn a_valid_message_lands_in_its_slot_and_goodbye_is_not_a_failure() {
    let mut bytes = data(5, 0, &[(0, 4), (64, 4)]);
    bytes.extend_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8]);
    // An empty message (no segments) is a message too.
    bytes.extend_from_slice(&data(5, 1, &[]));
    let mut credit = Header::new(Tag::Credit);
    credit.conn = 3;
    credit.seq = 3;
    bytes.extend_from_slice(&credit.encode());
    bytes.extend_from_slice(&Header::new(Tag::Heartbeat).encode());
    bytes.extend_from_slice(&Header::new(Tag::Goodbye).encode());
    let (inner, state, reason) = feed_after(&bytes, 3);
    assert_eq!(state, GONE, "{reason}");
    assert_eq!(inner.arena.abort().load(Ordering::Acquire), 0);
    assert_eq!(inner.arena.sent(1).load(Ordering::Acquire), 2);
    assert_eq!(inner.arena.consumed(0).load(Ordering::Acquire), 3);
    let slot = slot_bytes(&inner, 1, 0);
    assert_eq!(&slot[0..4], &[1, 2, 3, 4]);
    assert_eq!(&slot[64..68], &[5, 6, 7, 8]);
}

/// Found by a CI run of `tests/multihost.rs` under load (3 hosts x 2, the last call): a rank
/// sent its last message and exited; the root, behind, had the message in its socket but
/// its keeper's heartbeat to the exited rank failed first (`EPIPE`) and marked it failed,
/// and a failed peer was no longer read, so the root's wait for that message failed the
/// call. A failed peer's socket is read until its stream ends.
#[test]
fn a_peer_marked_failed_by_a_write_is_still_read_to_its_end() {
    let (mut peer, ours) = pair();
    let inner = inner_with(ours);
    let mut bytes = data(5, 0, &[(0, 4)]);
    bytes.extend_from_slice(&[9, 8, 7, 6]);
    peer.write_all(&bytes).unwrap();
    // The peer exits without a goodbye (`process::exit`).
    drop(peer);
    {
        use std::os::fd::AsRawFd;
        wait_fd(
            inner.peers[0].socks[0].read.as_raw_fd(),
            libc::POLLIN,
            Duration::from_secs(10),
        );
    }
    inner.fail(0, "sending to rank 0 on host h0 failed: Broken pipe".into());
    // The engine waits for message 0 of its incoming connection 1.
    inner.poll_conn(1);
    assert_eq!(inner.arena.sent(1).load(Ordering::Acquire), 1);
    assert_eq!(&slot_bytes(&inner, 1, 0)[0..4], &[9, 8, 7, 6]);
    // The stream ended: the reason stays the first one, and reading stops.
    let reason = inner.peers[0].reason.lock().unwrap().clone();
    assert!(reason.contains("Broken pipe"), "{reason}");
    assert!(matches!(
        inner.peers[0].socks[0].rx.lock().unwrap().stage,
        Stage::Closed
    ));
}

/// Found by review while writing the `frames` fuzz target (which now checks it): a credit
/// frame for more messages than this rank sent was taken, so a peer could make the
/// engine count free slots that do not exist (`send_seq - consumed` underflows: a panic
/// with overflow checks, a sender stalled to the timeout without them). It is a
/// malformed frame now.
#[test]
fn a_credit_for_messages_never_sent_is_a_malformed_frame() {
    for (sent, credit) in [(0, 1), (3, 4), (3, u64::MAX)] {
        let mut h = Header::new(Tag::Credit);
        h.conn = 3;
        h.seq = credit;
        let (inner, state, reason) = feed_after(&h.encode(), sent);
        assert_eq!(state, DEAD, "{sent} sent, credit {credit}: {reason}");
        assert!(
            reason.contains(&format!(
                "credit for {credit} messages on channel 3, where this rank sent {sent}"
            )),
            "{reason}"
        );
        assert_eq!(inner.arena.consumed(0).load(Ordering::Acquire), 0);
    }
}

#[test]
fn an_abort_frame_raises_the_local_abort_word() {
    let mut h = Header::new(Tag::Abort);
    h.a = 0;
    h.b = 1;
    let mut bytes = h.encode().to_vec();
    bytes.extend_from_slice(&Header::new(Tag::Goodbye).encode());
    let (inner, state, _) = feed(&bytes);
    assert_eq!(state, GONE);
    assert_eq!(
        inner.arena.abort().load(Ordering::Acquire),
        crate::engine::abort_word(0, 1)
    );
    // An abort naming a rank outside the job is a malformed frame.
    let mut h = Header::new(Tag::Abort);
    h.a = 7;
    let (_, state, reason) = feed(&h.encode());
    assert_eq!(state, DEAD);
    assert!(reason.contains("abort naming"), "{reason}");
}

#[test]
fn a_posted_message_lands_at_the_steps_destinations_and_only_there() {
    let (mut peer, ours) = pair();
    let inner = inner_with(ours);
    // The receiving step wants the message's bytes 0..4 at `a`, 64..68 at `b`; bytes
    // 100..104 have no destination and land in the slot.
    let (mut a, mut b) = ([0u8; 4], [0u8; 4]);
    let ranges = vec![
        Seg {
            off: 0,
            ptr: a.as_mut_ptr(),
            len: 4,
        },
        Seg {
            off: 64,
            ptr: b.as_mut_ptr(),
            len: 4,
        },
    ];
    let inb = inner.inbound[1].as_ref().unwrap();
    assert!(inb.post(0, ranges));
    let mut bytes = data(5, 0, &[(0, 4), (64, 8), (100, 4)]);
    bytes.extend_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]);
    // Message 1 is not posted: all of it lands in its slot.
    bytes.extend_from_slice(&data(5, 1, &[(0, 4)]));
    bytes.extend_from_slice(&[21, 22, 23, 24]);
    bytes.extend_from_slice(&Header::new(Tag::Goodbye).encode());
    let t = {
        let inner = Arc::clone(&inner);
        std::thread::spawn(move || receive_loop(&inner, 0, 0))
    };
    peer.write_all(&bytes).unwrap();
    drop(peer);
    t.join().unwrap();
    assert_eq!(inner.arena.sent(1).load(Ordering::Acquire), 2);
    assert_eq!(inb.take_post(0), Some(true));
    assert_eq!((a, b), ([1, 2, 3, 4], [5, 6, 7, 8]));
    let slot = slot_bytes(&inner, 1, 0);
    assert!(
        slot[..68].iter().all(|&x| x == 0),
        "posted bytes stay out of the slot"
    );
    assert_eq!(
        &slot[68..72],
        &[9, 10, 11, 12],
        "past the destination: the slot"
    );
    assert_eq!(&slot[100..104], &[13, 14, 15, 16]);
    assert_eq!(&slot_bytes(&inner, 1, 1)[..4], &[21, 22, 23, 24]);
}

#[test]
fn a_revoked_post_is_never_written_again() {
    let (mut peer, ours) = pair();
    let inner = inner_with(ours);
    let mut a = [0u8; 8];
    let inb = inner.inbound[1].as_ref().unwrap();
    assert!(inb.post(
        0,
        vec![Seg {
            off: 0,
            ptr: a.as_mut_ptr(),
            len: 8,
        }]
    ));
    inner.live_posts.store(1, Ordering::Release);
    // Half the message arrives by the post, then the call ends.
    let mut bytes = data(5, 0, &[(0, 8)]);
    bytes.extend_from_slice(&[1, 2, 3, 4]);
    peer.write_all(&bytes).unwrap();
    let mut rx = RxState::default();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !matches!(&rx.stage, Stage::Payload(_, _, _, 4, _, _)) {
        assert!(
            std::time::Instant::now() < deadline,
            "the first half never came"
        );
        pump(&inner, 0, 0, &mut rx).unwrap();
    }
    *inner.peers[0].socks[0].rx.lock().unwrap() = rx;
    inner.revoke_posts();
    assert_eq!(inner.live_posts.load(Ordering::Acquire), 0);
    assert_eq!(inb.take_post(0), None);
    peer.write_all(&[5, 6, 7, 8]).unwrap();
    peer.write_all(&Header::new(Tag::Goodbye).encode()).unwrap();
    drop(peer);
    let t = {
        let inner = Arc::clone(&inner);
        std::thread::spawn(move || receive_loop(&inner, 0, 0))
    };
    t.join().unwrap();
    assert_eq!(
        a,
        [1, 2, 3, 4, 0, 0, 0, 0],
        "nothing written after the revocation"
    );
    assert_eq!(&slot_bytes(&inner, 1, 0)[4..8], &[5, 6, 7, 8]);
}

#[test]
fn the_fuzzing_seeds_are_streams_that_end_in_goodbye() {
    let seeds = frame_seeds();
    let (last, whole) = seeds.split_last().unwrap();
    for (i, seed) in whole.iter().enumerate() {
        assert_eq!(fuzz_frames(seed), Ok(()), "seed {i}");
    }
    // The last one is cut short inside a message.
    let err = fuzz_frames(last).unwrap_err();
    assert!(err.contains("middle of a message"), "{err}");
    // Any cut of a seed is refused without a panic.
    for cut in 1..seeds[2].len() {
        let _ = fuzz_frames(&seeds[2][..cut]);
    }
}

#[test]
fn strangers_are_refused_and_the_real_peer_gets_in() {
    let arena = Arc::new(Arena::heap(Layout::new(2, 0, SLOT)).expect("heap arena"));
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let hosts = vec!["h0".to_string(), "h1".to_string()];
    let addrs = vec![String::new(), addr.clone()];
    let conns = ConnTable::default();
    let cfg = NetConfig::default();
    let setup = |me: u32| Setup {
        me,
        world: 2,
        hosts: &hosts,
        addrs: &addrs,
        conns: &conns,
        token: "job-token",
        nonce: "nonce-1",
        cfg: &cfg,
        slot_bytes: SLOT,
        checksum: false,
        timeout: Duration::from_secs(30),
        arena: Arc::clone(&arena),
        listener: None,
        deadline: Instant::now() + Duration::from_secs(30),
    };
    let hello = |token: &str, nonce: &str, from: u32, to: u32| {
        let mut b = DATA_MAGIC.to_vec();
        b.extend_from_slice(&DATA_PROTOCOL.to_le_bytes());
        write_str(&mut b, token);
        write_str(&mut b, nonce);
        for v in [from, to, 0, 1] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b
    };
    let strangers: Vec<Vec<u8>> = vec![
        b"GET / HTTP/1.0\r\n\r\n".to_vec(),
        hello("wrong-token", "nonce-1", 0, 1),
        hello("job-token", "another-job", 0, 1),
        hello("job-token", "nonce-1", 5, 1),
        hello("job-token", "nonce-1", 0, 0),
        b"HCCLDATA\x01\x00\x00\x00\xff\xff\xff\xff".to_vec(),
    ];
    std::thread::scope(|s| {
        let acceptor = s.spawn(|| accept_all(&setup(1), &listener, &[0], 1));
        for bytes in &strangers {
            let mut st = TcpStream::connect(&addr).unwrap();
            st.write_all(bytes).unwrap();
            let _ = st.shutdown(Shutdown::Write);
            st.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            let mut reply = Vec::new();
            let _ = st.read_to_end(&mut reply);
            assert!(reply.is_empty(), "a stranger got a reply: {reply:?}");
        }
        let mine = dial(&setup(0), 1, 0).expect("the real rank 0 is let in");
        let got = acceptor.join().unwrap().expect("accepted");
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].0, got[0].1), (0, 0));
        assert_eq!(got[0].2.peer_addr().unwrap(), mine.local_addr().unwrap());
    });
}

/// A heartbeat to a peer that is not reading (its socket full of this rank's data) is
/// skipped, not waited for: the keeper that waited held up the heartbeats to every other
/// peer, which under load took this rank for dead ("nothing heard ... for 10 s").
#[test]
fn a_heartbeat_to_a_full_socket_is_skipped_not_waited_for() {
    let (mut w, _peer_not_reading) = pair();
    w.set_nonblocking(true).unwrap();
    // Full for good: not a byte more fits, even after the peer's kernel acknowledged what
    // it took (a small write fits where `POLLOUT` is not signalled yet).
    let fill = |w: &mut TcpStream, len: usize| loop {
        match w.write(&vec![0u8; len]) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
            Err(e) => panic!("{e}"),
        }
    };
    loop {
        fill(&mut w, 1 << 16);
        fill(&mut w, proto::HEADER);
        std::thread::sleep(Duration::from_millis(300));
        match w.write(&[0u8; proto::HEADER]) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) => panic!("{e}"),
            Ok(_) => {}
        }
    }
    let beat = Header::new(Tag::Heartbeat).encode();
    // Waiting for room would fail after the limit: the peer takes nothing.
    beat_on(&mut w, &beat, Duration::from_millis(100)).expect("skipped");
}
