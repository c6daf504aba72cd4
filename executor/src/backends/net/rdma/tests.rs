use super::super::Wires;
use super::super::proto::Inbound;
use super::device::*;
use super::wire::*;
use super::*;
use crate::arena::Arena;
use crate::arena::Layout;
use ibverbs::GidEntry;

fn offer() -> Offer {
    Offer {
        from: 3,
        to: 12,
        wants: true,
        qpn: 0x1234,
        lid: 7,
        gid: Some([0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8]),
        slot_bytes: 256 * 1024,
        cap: message_cap(256 * 1024) as u32,
        reason: String::new(),
    }
}

#[test]
fn offers_round_trip_and_malformed_ones_are_refused() {
    for o in [
        offer(),
        Offer {
            gid: None,
            ..offer()
        },
        Offer {
            wants: false,
            qpn: 0,
            lid: 0,
            gid: None,
            reason: "no RDMA devices: Function not implemented (os error 38)".into(),
            ..offer()
        },
    ] {
        let bytes = o.encode();
        assert_eq!(Offer::read(&mut bytes.as_slice()), Ok(o.clone()));
        // Truncated anywhere: refused.
        for cut in [0, 7, 63, bytes.len() - 1] {
            if cut < bytes.len() {
                assert!(Offer::read(&mut &bytes[..cut]).is_err(), "cut at {cut}");
            }
        }
    }
    // A long reason is cut at a character boundary.
    let long = Offer {
        wants: false,
        qpn: 0,
        gid: None,
        reason: "é".repeat(MAX_REASON),
        ..offer()
    };
    let back = Offer::read(&mut long.encode().as_slice()).unwrap();
    assert_eq!(back.reason.len(), MAX_REASON);
    let good = offer().encode();
    let fixed = |b: &[u8]| -> [u8; OFFER_LEN] { b[..OFFER_LEN].try_into().unwrap() };
    let reseal = |mut b: Vec<u8>| {
        let check = fnv1a(&b[..60]);
        b[60..64].copy_from_slice(&check.to_le_bytes());
        b
    };
    // Wrong magic (a TCP frame header, as from a peer built without `rdma`).
    let mut bad = good.clone();
    bad[..8].copy_from_slice(&[3, 0, 0, 0, 0, 0, 0, 0]);
    assert!(
        Offer::decode_fixed(&fixed(&bad))
            .unwrap_err()
            .contains("rdma feature")
    );
    // A flipped bit: check word.
    let mut bad = good.clone();
    bad[25] ^= 1;
    assert!(
        Offer::decode_fixed(&fixed(&bad))
            .unwrap_err()
            .contains("check")
    );
    // Version, flags, queue pair number, buffer size, reason length, endpoint without RDMA.
    for (at, val, what) in [
        (8usize, 2u32, "version"),
        (20, 8, "flags"),
        (24, 0, "queue pair"),
        (24, 1 << 24, "queue pair"),
        (56, 16, "receive buffers"),
        (56, MAX_CAP as u32 + 64, "receive buffers"),
        (20, FLAG_GID, "endpoint"),
    ] {
        let mut bad = good.clone();
        bad[at..at + 4].copy_from_slice(&val.to_le_bytes());
        let e = Offer::decode_fixed(&fixed(&reseal(bad))).unwrap_err();
        assert!(e.contains(what), "{what}: {e}");
    }
    let mut bad = good.clone();
    bad[30..32].copy_from_slice(&(MAX_REASON as u16 + 1).to_le_bytes());
    assert!(
        Offer::decode_fixed(&fixed(&reseal(bad)))
            .unwrap_err()
            .contains("reason")
    );
}

#[test]
fn ready_records_round_trip_and_garbage_is_refused() {
    assert_eq!(decode_ready(&encode_ready(true)), Ok(true));
    assert_eq!(decode_ready(&encode_ready(false)), Ok(false));
    let mut bad = encode_ready(true);
    bad[8] = 2;
    assert!(decode_ready(&bad).is_err());
    let mut bad = encode_ready(true);
    bad[0] = b'X';
    assert!(decode_ready(&bad).is_err());
    assert!(decode_ready(&[0u8; READY_LEN]).is_err());
}

#[test]
fn work_request_ids_round_trip() {
    for (p, b) in [
        (0usize, 0usize),
        (1, 63),
        (65_535, 7),
        (u32::MAX as usize, u32::MAX as usize),
    ] {
        assert_eq!(split_wr_id(wr_id(p, b)), (p, b));
    }
}

#[test]
fn hca_specs_parse() {
    let s = parse_hca(Some("mlx5_0:1")).unwrap();
    assert!(s.matches("mlx5_0") && s.matches("mlx5_01") && !s.matches("mlx4_0"));
    let s = parse_hca(Some("=mlx5_0")).unwrap();
    assert!(s.matches("mlx5_0") && !s.matches("mlx5_01"));
    assert!(parse_hca(None).unwrap().matches("anything"));
    assert!(parse_hca(Some("  ")).unwrap().matches("anything"));
    assert!(
        parse_hca(Some("mlx5_0:2"))
            .unwrap_err()
            .contains("port 1 only")
    );
    assert!(parse_hca(Some("mlx5_0:x")).is_err());
    assert!(parse_hca(Some("mlx5_0,mlx5_1")).is_err());
    assert!(parse_hca(Some("^mlx5_0")).is_err());
}

#[test]
fn gids_round_trip_and_routing_prefers_roce_v2_ipv4() {
    let raw = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 7];
    let g = gid_from(raw);
    assert_eq!(gid_bytes(&g), raw);
    let entry = |i: u32, ty: u32, gid: [u8; 16]| GidEntry {
        gid: gid_from(gid),
        gid_index: i,
        port_num: PORT,
        gid_type: ty,
        ndev_ifindex: 0,
    };
    let link_local = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8];
    let table = vec![
        entry(0, 1, link_local),
        entry(1, GID_TYPE_ROCE_V2, link_local),
        entry(2, 1, raw),
        entry(3, GID_TYPE_ROCE_V2, raw),
    ];
    assert_eq!(choose_gid(&table), Some(3));
    assert_eq!(choose_gid(&table[..3]), Some(1));
    assert_eq!(choose_gid(&[entry(0, GID_TYPE_IB, link_local)]), Some(0));
    assert_eq!(choose_gid(&[]), None);
    // An entry whose index is not its position is not used.
    assert_eq!(
        choose_gid(&[entry(0, 1, link_local), entry(5, GID_TYPE_ROCE_V2, raw)]),
        Some(0)
    );
}

/// Segments of `src` that land at `offs` in the slot.
fn segs(src: &[u8], pieces: &[(usize, usize, usize)]) -> Vec<Seg> {
    pieces
        .iter()
        .map(|&(from, len, off)| Seg {
            off,
            ptr: src[from..].as_ptr(),
            len,
        })
        .collect()
}

/// The call every test message of `seq` carries.
fn call_of(seq: u64) -> Option<(u64, u64)> {
    Some((seq + 1, 0x00c0_ffee_0000 + seq))
}

fn encode_all(parts: &[Vec<Seg>], conn: u32, seq: u64) -> Vec<Vec<u8>> {
    parts
        .iter()
        .map(|part| {
            let call = call_of(seq);
            let mut buf = vec![0u8; part_len(part, call.is_some())];
            // SAFETY: the segments point into a live test buffer.
            let n = unsafe { encode_part(&mut buf, conn, seq, parts.len() as u32, part, call) };
            assert_eq!(n, buf.len());
            buf
        })
        .collect()
}

#[test]
fn packing_keeps_every_byte_once_within_the_room() {
    let src: Vec<u8> = (0..4096u32).map(|i| (i * 7 % 251) as u8).collect();
    let pieces = [
        (0, 100, 0),
        (100, 0, 200),
        (200, 1000, 300),
        (1500, 37, 2000),
    ];
    let s = segs(&src, &pieces);
    for room in [9usize, 16, 64, 300, 1 << 20] {
        let parts = pack(&s, room);
        assert!(
            parts.iter().all(|p| part_len(p, false) - HEADER <= room),
            "room {room}"
        );
        let flat: Vec<(usize, usize)> = parts
            .iter()
            .flatten()
            .flat_map(|s| (0..s.len).map(move |i| (s.off + i, s.ptr as usize + i)))
            .collect();
        let want: Vec<(usize, usize)> = s
            .iter()
            .flat_map(|s| (0..s.len).map(move |i| (s.off + i, s.ptr as usize + i)))
            .collect();
        assert_eq!(flat, want, "room {room}");
    }
    assert_eq!(pack(&[], 64).len(), 1);
    assert_eq!(pack(&s, 1 << 20).len(), 1);
}

#[test]
fn messages_land_in_their_slots_and_publish_in_order() {
    let slot_bytes = 4096;
    let arena = Arena::heap(Layout::new(2, 2, slot_bytes)).unwrap();
    // Connection 0 comes from peer 0, connection 1 goes to it, both on channel 7.
    let wires = Wires::new(&[Dir::In(0), Dir::Out(0)], vec![7, 7], 1);
    let inbound = [Some(Inbound::default()), None];
    let src: Vec<u8> = (0..4096u32).map(|i| (i % 253) as u8 + 1).collect();
    let pieces = [(0, 500, 0), (600, 1200, 1024), (2000, 3, 4093)];
    let s = segs(&src, &pieces);
    for seq in 0..2u64 {
        let parts = pack(&s, 700);
        assert!(parts.len() > 2);
        let msgs = encode_all(&parts, 7, seq);
        // Deliver the parts of message `seq`; only the last publishes it.
        for (j, m) in msgs.iter().enumerate() {
            place(&arena, &wires, &inbound, slot_bytes, 0, m).unwrap();
            let sent = arena.sent(0).load(Ordering::Acquire);
            assert_eq!(sent, if j + 1 == msgs.len() { seq + 1 } else { seq });
        }
        // The sender's call reaches the receiving step.
        let (num, print) = arena.peer_call(0, seq);
        assert_eq!(
            Some((num.load(Ordering::Relaxed), print.load(Ordering::Relaxed))),
            call_of(seq)
        );
        let slot = arena.slot(0, seq);
        for &(from, len, off) in &pieces {
            // SAFETY: inside the slot.
            let got = unsafe { std::slice::from_raw_parts(slot.add(off), len) };
            assert_eq!(got, &src[from..from + len]);
        }
    }
    // Message 2 needs slot 0 freed; a credit-window violation is refused.
    let m = encode_all(&pack(&s, 1 << 20), 7, 2);
    assert!(
        place(&arena, &wires, &inbound, slot_bytes, 0, &m[0])
            .unwrap_err()
            .contains("window")
    );
    arena.consumed(0).store(1, Ordering::Release);
    place(&arena, &wires, &inbound, slot_bytes, 0, &m[0]).unwrap();
    assert_eq!(arena.sent(0).load(Ordering::Acquire), 3);
    // Credits raise `consumed` of the outgoing connection, never lower it.
    let credit = |conn: u32, n: u64| {
        let mut h = Header::new(Tag::Credit);
        h.conn = conn;
        h.seq = n;
        h.encode().to_vec()
    };
    place(&arena, &wires, &inbound, slot_bytes, 0, &credit(7, 5)).unwrap();
    place(&arena, &wires, &inbound, slot_bytes, 0, &credit(7, 3)).unwrap();
    assert_eq!(arena.consumed(1).load(Ordering::Acquire), 5);
    // Wrong directions and peers.
    assert!(place(&arena, &wires, &inbound, slot_bytes, 0, &credit(2, 9)).is_err());
    assert!(place(&arena, &wires, &inbound, slot_bytes, 1, &credit(7, 9)).is_err());
    let m = encode_all(&pack(&s, 1 << 20), 1, 0);
    assert!(
        place(&arena, &wires, &inbound, slot_bytes, 0, &m[0])
            .unwrap_err()
            .contains("channel 1, where it has no connection")
    );
}

#[test]
fn malformed_messages_are_refused() {
    let src = [7u8; 64];
    let s = segs(&src, &[(0, 64, 0)]);
    let m = encode_all(&pack(&s, 1 << 20), 0, 0).remove(0);
    assert!(matches!(decode_msg(&m, 4096), Ok(Msg::Data { payload, .. }) if payload == &src[..]));
    // Truncated, extended, short header.
    assert!(decode_msg(&m[..m.len() - 1], 4096).is_err());
    let mut long = m.clone();
    long.push(0);
    assert!(decode_msg(&long, 4096).is_err());
    assert!(decode_msg(&m[..10], 4096).is_err());
    // Segment outside a smaller slot.
    assert!(decode_msg(&m, 32).unwrap_err().contains("outside"));
    // Frames that belong on TCP, and a credit with a body.
    let hb = Header::new(Tag::Heartbeat).encode();
    assert!(decode_msg(&hb, 4096).unwrap_err().contains("TCP"));
    let mut c = Header::new(Tag::Credit).encode().to_vec();
    c.push(1);
    assert!(decode_msg(&c, 4096).is_err());
    // Garbage header.
    assert!(decode_msg(&[0xAB; 64], 4096).is_err());
    // The sender's call rides in the trailer; a checksum trailer never travels here.
    assert!(matches!(decode_msg(&m, 4096), Ok(Msg::Data { call, .. }) if call == call_of(0)));
    let mut crc = m.clone();
    crc[1] |= proto::FLAG_CRC;
    assert!(decode_msg(&crc, 4096).unwrap_err().contains("checksum"));
    let mut bare = vec![0u8; part_len(&s, false)];
    // SAFETY: the segments point into `src`, which is live.
    let n = unsafe { encode_part(&mut bare, 0, 0, 1, &s, None) };
    assert_eq!(n, bare.len());
    assert!(matches!(
        decode_msg(&bare, 4096),
        Ok(Msg::Data { call: None, .. })
    ));
}

#[test]
fn message_cap_fits_a_slot_and_a_table() {
    assert!(message_cap(64) >= HEADER + 64 + TABLE_ROOM);
    assert_eq!(message_cap(256 * 1024) % 64, 0);
    assert_eq!(message_cap(1 << 30), MAX_CAP);
    assert!(message_cap(64) >= MIN_CAP);
}

/// Two ranks on two "hosts" of this process (loopback TCP), with these transport
/// choices; the results of `ProcessGroup::init_with`.
fn two_hosts(tag: &str, kinds: [NetKind; 2]) -> Vec<crate::Result<crate::Communicator>> {
    crate::config::init_tracing();
    let port = crate::backends::process::local_rendezvous_port().expect("a free port");
    std::thread::scope(|s| {
        let handles: Vec<_> = kinds
            .iter()
            .enumerate()
            .map(|(r, &kind)| {
                let boot = crate::Bootstrap {
                    addr: format!("127.0.0.1:{port}"),
                    token: "rdma-test".into(),
                    host: Some(format!("{tag}-h{r}")),
                };
                let cfg = crate::Config::default()
                    .with_timeout(Duration::from_secs(20))
                    .with_net(NetConfig {
                        kind,
                        ..NetConfig::default()
                    });
                s.spawn(move || {
                    crate::ProcessGroup::init_with(
                        crate::fallback::plan(2),
                        r as u32,
                        2,
                        &boot,
                        cfg,
                    )
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank thread"))
            .collect()
    })
}

fn all_reduce(comms: Vec<crate::Result<crate::Communicator>>) {
    let outs: Vec<Vec<f32>> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .into_iter()
            .map(|c| {
                s.spawn(move || {
                    let mut c = c.expect("joined");
                    let mut buf = vec![1.5f32; 70_001];
                    c.all_reduce_in_place(&mut buf, crate::ReduceOp::Sum)
                        .expect("all-reduce");
                    buf
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for out in outs {
        assert!(out.iter().all(|&x| x == 3.0));
    }
}

#[test]
fn without_a_device_the_job_negotiates_tcp() {
    // Unset on both sides, or socket on one: every pair agrees on TCP (with a device,
    // the first pair would use RDMA and the second TCP).
    all_reduce(two_hosts("rdma-auto", [NetKind::Auto, NetKind::Auto]));
    all_reduce(two_hosts("rdma-mixed", [NetKind::Socket, NetKind::Auto]));
}

#[test]
fn without_a_device_hccl_net_ib_is_a_clear_error() {
    if let Ok(dev) = probe(None) {
        println!("skipped: RDMA device {dev} present");
        return;
    }
    for r in two_hosts("rdma-ib", [NetKind::Ib, NetKind::Ib]) {
        let Err(e) = r else {
            panic!("HCCL_NET=ib without a device joined");
        };
        let text = e.to_string();
        assert!(
            text.contains("HCCL_NET=ib") && text.contains("RDMA"),
            "{text}"
        );
    }
}

#[test]
fn device_path_or_skip() {
    match probe(None) {
        Err(why) => println!("skipped: no RDMA device ({why})"),
        Ok(name) => {
            // A device is present: open it, build a queue pair and connect it to itself,
            // then send one message through the staging/receive buffers.
            let (dev, ctx) = open_device(Some(&format!("={name}"))).expect("opening the device");
            let gid = choose_gid(ctx.gid_table());
            let cq = ctx.create_cq(16, 0).expect("completion queue");
            let pd = ctx.alloc_pd().expect("protection domain");
            let mut b = pd.create_qp(&cq, &cq, ibverbs::ibv_qp_type::IBV_QPT_RC);
            b.set_max_send_wr(4).set_max_recv_wr(4).set_rnr_retry(7);
            if let Some(g) = gid {
                b.set_gid_index(g);
            }
            let pqp = b.build().expect("queue pair");
            let ep = pqp.endpoint();
            // The endpoint survives the offer encoding.
            let o = Offer {
                qpn: ep.num,
                lid: ep.lid,
                gid: ep.gid.as_ref().map(gid_bytes),
                ..offer()
            };
            let back = Offer::read(&mut o.encode().as_slice()).unwrap();
            let remote = QueuePairEndpoint {
                num: back.qpn,
                lid: back.lid,
                gid: back.gid.map(gid_from),
            };
            assert_eq!(remote, ep);
            let mut qp = pqp.handshake(remote).expect("handshake");
            let cap = message_cap(4096);
            let mut rx = pd.allocate::<u8>(cap).unwrap();
            let mut tx = pd.allocate::<u8>(cap).unwrap();
            let src = [9u8; 100];
            let s = segs(&src, &[(0, 100, 64)]);
            let part = &pack(&s, cap - HEADER)[0];
            // SAFETY: `src` is live; `tx` holds `cap` bytes.
            let n = unsafe { encode_part(&mut tx, 0, 0, 1, part, None) };
            // SAFETY: the buffers stay untouched until both completions arrived.
            unsafe { qp.post_receive(&mut rx, .., wr_id(0, 0)) }.unwrap();
            unsafe { qp.post_send(&mut tx, ..n, 0) }.unwrap();
            let mut wcs = [ibv_wc::default(); 4];
            let (mut got, until) = (0, Instant::now() + Duration::from_secs(5));
            while got < 2 && Instant::now() < until {
                for wc in cq.poll(&mut wcs).unwrap().iter() {
                    assert!(wc.error().is_none(), "{:?}", wc.error());
                    got += 1;
                }
            }
            assert_eq!(got, 2, "{dev}: loopback completions");
            let arena = Arena::heap(Layout::new(2, 1, 4096)).unwrap();
            let inbound = [Some(Inbound::default())];
            let wires = Wires::new(&[Dir::In(0)], vec![0], 1);
            place(&arena, &wires, &inbound, 4096, 0, &rx[..n]).unwrap();
            assert_eq!(arena.sent(0).load(Ordering::Acquire), 1);
            println!("RDMA device {dev}: loopback message delivered");
        }
    }
}
