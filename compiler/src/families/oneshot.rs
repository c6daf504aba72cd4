//! `oneshot`: AllReduce in a single hop. Every rank sends its whole buffer to every other rank
//! and folds what it receives into its output. It moves `(n-1)·M` bytes per rank instead of
//! a ring's `2(n-1)/n·M`, so it only wins where latency dominates: small messages, and
//! shared-memory hosts where a hop costs a flag store and the bytes are few. It is the one
//! AllReduce whose critical path is one message, which is what a latency-bound call needs.

use super::common::single_rank;
use super::{Candidate, Family, FamilyParams};
use hccl_ir::{Collective, CollectiveKind, Loc, Op, RankProgram, Schedule, Step, Stream};
use hccl_topologies::Topology;

/// Ranks beyond which the family is not offered: its traffic grows as ranks², and beyond a
/// few dozen ranks some tree or ring always wins even for one element.
const MAX_RANKS: u32 = 64;

/// The `oneshot` family.
#[derive(Debug, Clone, Copy, Default)]
pub struct OneShot;

impl Family for OneShot {
    fn name(&self) -> &'static str {
        "oneshot"
    }

    fn supports(&self, kind: CollectiveKind) -> bool {
        kind == CollectiveKind::AllReduce
    }

    fn param_space(&self, topo: &Topology, collective: Collective) -> Vec<FamilyParams> {
        if collective == Collective::AllReduce && topo.nranks() <= MAX_RANKS {
            vec![FamilyParams {
                channels: 1,
                pipeline: 1,
            }]
        } else {
            Vec::new()
        }
    }

    /// The schedule for either buffer arrangement; AllReduce only.
    fn schedules(
        &self,
        topo: &Topology,
        collective: Collective,
        params: FamilyParams,
        in_place: bool,
    ) -> Vec<Candidate> {
        let n = topo.nranks();
        if collective != Collective::AllReduce || n > MAX_RANKS {
            return Vec::new();
        }
        if n == 1 {
            return single_rank("oneshot", collective, in_place, params);
        }
        let ranks = (0..n)
            .map(|r| {
                let mut steps = Vec::with_capacity(2 * n as usize);
                if !in_place {
                    steps.push(Step::new(
                        Op::Copy {
                            src: Loc::input(0),
                            dst: Loc::output(0),
                        },
                        1,
                    ));
                }
                // Sends first (one message per connection, so they never block), then the
                // receives fold in, nearest peer first.
                for k in 1..n {
                    let to = (r + k) % n;
                    steps.push(Step::new(
                        Op::Send {
                            to,
                            src: Loc::input(0),
                        },
                        1,
                    ));
                }
                for k in 1..n {
                    let from = (r + n - k) % n;
                    steps.push(Step::new(
                        Op::RecvReduceCopy {
                            from,
                            src: Loc::output(0),
                            dst: Loc::output(0),
                        },
                        1,
                    ));
                }
                RankProgram {
                    scratch_chunks: 0,
                    streams: vec![Stream { channel: 0, steps }],
                }
            })
            .collect();
        let schedule = Schedule {
            collective,
            nranks: n,
            chunks: 1,
            input_chunks: 1,
            output_chunks: 1,
            in_place,
            ranks,
        };
        vec![Candidate {
            algorithm: "oneshot".to_string(),
            params,
            schedule,
            symmetry: None,
            min_bytes: 0,
            synthesis: None,
            template: None,
        }]
    }

    fn estimated_steps(
        &self,
        topo: &Topology,
        _collective: Collective,
        _params: FamilyParams,
    ) -> Option<u64> {
        let n = u64::from(topo.nranks());
        Some(n * (2 * n.saturating_sub(1) + 1))
    }
}
