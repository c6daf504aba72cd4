//! Test data and its checks: the shape of one call for a nominal size, the buffers of one rank
//! filled with values every reduction order sums exactly, the call itself, and the count of
//! wrong elements against a sequential reference; AllToAllv's count matrices and buffers.

use crate::args::Counts;
use hccl::executor::{Buffers, Communicator, Element, ExecError, ReduceOp};
use hccl::ir::{Collective, CollectiveKind};

fn mix(mut h: u64) -> u64 {
    h ^= h >> 31;
    h = h.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    h ^= h >> 29;
    h = h.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    h ^ (h >> 32)
}

/// `m[s][d]`: the elements rank `s` sends rank `d`.
pub(crate) fn count_matrix(counts: Counts, seed: u64, n: u32, per: usize) -> Vec<Vec<usize>> {
    let n = n as usize;
    (0..n)
        .map(|s| {
            (0..n)
                .map(|d| match counts {
                    Counts::Uniform => {
                        let h = mix(seed ^ mix(((s as u64) << 32) | d as u64));
                        if h.is_multiple_of(8) {
                            0
                        } else {
                            let hi = (16 * per as u64).div_ceil(7);
                            ((h >> 3) % (hi + 1)) as usize
                        }
                    }
                    Counts::Equal => per,
                    Counts::Skewed => {
                        let weight = |d: usize| match d {
                            0 => n,
                            _ if d == n - 1 && n > 2 => 0,
                            _ => 1,
                        };
                        let total: usize = (0..n).map(weight).sum();
                        per * n * weight(d) / total.max(1)
                    }
                })
                .collect()
        })
        .collect()
}

/// AllToAllv test data: rank `s`'s element `i` of its block for rank `d`, from 1 to 100
/// (exact in every type), so a block landing at the wrong place or shifted is caught.
fn vvalue<T: Element>(s: usize, d: usize, i: usize) -> T {
    T::from_i64(1 + (mix(((s as u64) << 48) ^ ((d as u64) << 32) ^ i as u64) % 100) as i64)
}

/// One rank's AllToAllv buffers: counts and packed displacements on both sides.
pub(crate) struct VBuffers<T> {
    pub(crate) input: Vec<T>,
    pub(crate) output: Vec<T>,
    pub(crate) send: Vec<usize>,
    pub(crate) sdispl: Vec<usize>,
    pub(crate) recv: Vec<usize>,
    pub(crate) rdispl: Vec<usize>,
}

fn packed(counts: &[usize]) -> (Vec<usize>, usize) {
    let mut at = 0;
    let displs = counts
        .iter()
        .map(|&c| {
            at += c;
            at - c
        })
        .collect();
    (displs, at)
}

impl<T: Element> VBuffers<T> {
    pub(crate) fn new(m: &[Vec<usize>], rank: u32) -> VBuffers<T> {
        let r = rank as usize;
        let send = m[r].clone();
        let recv: Vec<usize> = m.iter().map(|row| row[r]).collect();
        let (sdispl, slen) = packed(&send);
        let (rdispl, rlen) = packed(&recv);
        let mut input = Vec::with_capacity(slen);
        for (d, &c) in send.iter().enumerate() {
            input.extend((0..c).map(|i| vvalue::<T>(r, d, i)));
        }
        VBuffers {
            input,
            output: vec![T::default(); rlen],
            send,
            sdispl,
            recv,
            rdispl,
        }
    }

    pub(crate) fn call(&mut self, comm: &mut Communicator) -> Result<(), ExecError> {
        comm.all_to_all_v(
            &self.input,
            &self.send,
            &self.sdispl,
            &mut self.output,
            &self.recv,
            &self.rdispl,
        )
    }

    pub(crate) fn count_wrong(&self, rank: u32) -> u64 {
        let mut wrong = 0;
        for (s, &c) in self.recv.iter().enumerate() {
            for i in 0..c {
                let want = vvalue::<T>(s, rank as usize, i);
                if self.output[self.rdispl[s] + i].to_f64().to_bits() != want.to_f64().to_bits() {
                    wrong += 1;
                }
            }
        }
        wrong
    }
}

/// What one call looks like for a given nominal size.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shape {
    /// Bytes in the nccl-tests sense (after rounding to whole elements).
    pub(crate) bytes: u64,
    /// Elements of the input and output buffers (in-place: the one buffer is the larger).
    pub(crate) in_len: usize,
    pub(crate) out_len: usize,
    /// The count nccl-tests prints.
    pub(crate) count: usize,
}

pub(crate) fn shape(kind: CollectiveKind, nominal: u64, elem: usize, n: u32) -> Shape {
    let n = n as usize;
    let total = (nominal as usize / elem).max(1);
    match kind {
        CollectiveKind::AllReduce | CollectiveKind::Broadcast | CollectiveKind::Reduce => Shape {
            bytes: (total * elem) as u64,
            in_len: total,
            out_len: total,
            count: total,
        },
        CollectiveKind::AllGather => {
            let per = (total / n).max(1);
            Shape {
                bytes: (per * n * elem) as u64,
                in_len: per,
                out_len: per * n,
                count: per * n,
            }
        }
        CollectiveKind::ReduceScatter => {
            let per = (total / n).max(1);
            Shape {
                bytes: (per * n * elem) as u64,
                in_len: per * n,
                out_len: per,
                count: per * n,
            }
        }
        CollectiveKind::AllToAll => {
            let per = (total / n).max(1);
            Shape {
                bytes: (per * n * elem) as u64,
                in_len: per * n,
                out_len: per * n,
                count: per * n,
            }
        }
    }
}

/// Test data: small integers, so every reduction order gives the same exact result.
fn value<T: Element>(op: ReduceOp, rank: u32, index: usize) -> T {
    let mix = (rank as usize)
        .wrapping_mul(7)
        .wrapping_add(index.wrapping_mul(3));
    match op {
        ReduceOp::Prod => T::from_i64(1 + i64::from(mix.is_multiple_of(4))),
        _ => T::from_i64((mix % 5) as i64 + 1),
    }
}

fn fold<T: Element>(op: ReduceOp, n: u32, mut item: impl FnMut(u32) -> T) -> T {
    let mut acc = item(0);
    for r in 1..n {
        let x = item(r);
        acc = match op {
            ReduceOp::Sum | ReduceOp::Avg => T::add(acc, x),
            ReduceOp::Prod => T::mul(acc, x),
            ReduceOp::Min => {
                if x < acc {
                    x
                } else {
                    acc
                }
            }
            ReduceOp::Max => {
                if x > acc {
                    x
                } else {
                    acc
                }
            }
        };
    }
    if op == ReduceOp::Avg {
        acc.div_count(n)
    } else {
        acc
    }
}

/// What rank `rank`'s output element `i` must hold; `None` where nothing is promised.
fn expected<T: Element>(
    coll: Collective,
    op: ReduceOp,
    n: u32,
    rank: u32,
    per: usize,
    i: usize,
) -> Option<T> {
    Some(match coll {
        Collective::AllReduce => fold(op, n, |r| value(op, r, i)),
        Collective::Reduce { root } => {
            if rank != root {
                return None;
            }
            fold(op, n, |r| value(op, r, i))
        }
        Collective::Broadcast { root } => value(op, root, i),
        Collective::AllGather => value(op, (i / per) as u32, i % per),
        Collective::ReduceScatter => fold(op, n, |r| value(op, r, rank as usize * per + i)),
        Collective::AllToAll => value(op, (i / per) as u32, rank as usize * per + i % per),
    })
}

/// One rank's buffers for one size, filled with test data.
pub(crate) struct RankBuffers<T> {
    pub(crate) input: Vec<T>,
    pub(crate) output: Vec<T>,
}

pub(crate) fn fill<T: Element>(
    buffers: &mut RankBuffers<T>,
    coll: Collective,
    op: ReduceOp,
    rank: u32,
    s: &Shape,
    in_place: bool,
) {
    let n_in = s.in_len;
    if in_place {
        // One buffer of the larger extent; the input sits where NCCL puts it.
        let len = s.in_len.max(s.out_len);
        buffers.output.clear();
        buffers.output.resize(len, T::default());
        let base = match coll.kind() {
            CollectiveKind::AllGather => rank as usize * n_in,
            _ => 0,
        };
        for i in 0..n_in {
            buffers.output[base + i] = value(op, rank, i);
        }
    } else {
        buffers.input.clear();
        buffers
            .input
            .extend((0..n_in).map(|i| value::<T>(op, rank, i)));
        buffers.output.clear();
        buffers.output.resize(s.out_len, T::default());
    }
}

pub(crate) fn call<T: Element>(
    comm: &mut Communicator,
    coll: Collective,
    op: ReduceOp,
    b: &mut RankBuffers<T>,
    in_place: bool,
) -> Result<(), ExecError> {
    let buffers = if in_place {
        Buffers::InPlace(&mut b.output)
    } else {
        Buffers::OutOfPlace {
            input: &b.input,
            output: &mut b.output,
        }
    };
    comm.run(coll, op, buffers)
}

pub(crate) fn count_wrong<T: Element>(
    b: &RankBuffers<T>,
    coll: Collective,
    op: ReduceOp,
    n: u32,
    rank: u32,
    s: &Shape,
    in_place: bool,
) -> u64 {
    let per = match coll.kind() {
        CollectiveKind::AllGather => s.in_len,
        CollectiveKind::ReduceScatter => s.out_len,
        CollectiveKind::AllToAll => s.in_len / n as usize,
        _ => s.out_len,
    };
    let (data, offset) = match (in_place, coll.kind()) {
        (true, CollectiveKind::ReduceScatter) => (&b.output[..], rank as usize * s.out_len),
        _ => (&b.output[..], 0),
    };
    let mut wrong = 0;
    for i in 0..s.out_len {
        if let Some(want) = expected::<T>(coll, op, n, rank, per, i)
            && data[offset + i].to_f64().to_bits() != want.to_f64().to_bits()
            && !(data[offset + i].to_f64().is_nan() && want.to_f64().is_nan())
        {
            wrong += 1;
        }
    }
    wrong
}
