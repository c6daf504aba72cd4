//! What every phase of one compile reads ([`Search`]) and the costed candidates the phases
//! after costing share ([`Costed`]).

use super::options::{Options, SearchError};
use crate::cost::{NcclTopo, Network, Simulator, device_models};
use crate::families::{Candidate, Family};
use hccl_ir::Protocol;
use hccl_topologies::Topology;

/// One compile's fixed inputs: the options (their protocols those the target offers), the
/// sizes (sorted, deduplicated), the family registry at the options' synthesis level, the
/// simulator and NCCL's view of the machine.
pub(super) struct Search<'a> {
    pub(super) topo: &'a Topology,
    pub(super) options: &'a Options,
    pub(super) sizes: Vec<u64>,
    pub(super) families: Vec<Box<dyn Family>>,
    pub(super) sim: Simulator,
    pub(super) nccl: NcclTopo,
}

impl<'a> Search<'a> {
    /// The search of `topo` under `options`, whose protocols must already be the offered
    /// ones ([`offered_options`]).
    pub(super) fn new(
        topo: &'a Topology,
        options: &'a Options,
        families: Vec<Box<dyn Family>>,
    ) -> Search<'a> {
        let mut sizes = options.sizes.clone();
        sizes.sort_unstable();
        sizes.dedup();
        let sim = Simulator::new(Network::new(topo), options.model.clone());
        let nccl = NcclTopo::new(&sim.network, &device_models(topo));
        Search {
            topo,
            options,
            sizes,
            families,
            sim,
            nccl,
        }
    }

    /// Whether `--algo` lets the algorithm called `name` win.
    pub(super) fn allowed(&self, name: &str) -> bool {
        self.options
            .algorithms
            .as_ref()
            .is_none_or(|list| list.iter().any(|n| n == name))
    }
}

/// The options with only the protocols the target's executor implements (`None`: all of
/// them are, use `options` as it is); an error when there are no sizes or protocols, none
/// is offered, or `--algo` names an unknown algorithm.
pub(super) fn offered_options(
    options: &Options,
    families: &[Box<dyn Family>],
) -> Result<Option<Options>, SearchError> {
    if options.sizes.is_empty() {
        return Err(SearchError::BadOptions(
            "no message sizes to compile for".into(),
        ));
    }
    if options.protocols.is_empty() {
        return Err(SearchError::BadOptions(
            "no protocols to compile for".into(),
        ));
    }
    // Only the protocols the target's executor implements compete.
    let offered: Vec<Protocol> = options
        .protocols
        .iter()
        .copied()
        .filter(|&p| options.model.offers(p))
        .collect();
    if offered.is_empty() {
        let names: Vec<&str> = options.protocols.iter().map(|p| p.name()).collect();
        return Err(SearchError::BadOptions(format!(
            "none of the protocols {} runs on this target (it offers {})",
            names.join(", "),
            Protocol::ALL
                .iter()
                .filter(|&&p| options.model.offers(p))
                .map(|p| p.name())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    if let Some(wanted) = &options.algorithms {
        for name in wanted {
            let known = families.iter().any(|f| f.name() == name)
                || options.extra.iter().any(|c| &c.algorithm == name);
            if !known {
                let mut names: Vec<&str> = families.iter().map(|f| f.name()).collect();
                names.extend(options.extra.iter().map(|c| c.algorithm.as_str()));
                return Err(SearchError::BadOptions(format!(
                    "unknown algorithm `{name}` (known: {})",
                    names.join(", ")
                )));
            }
        }
    }
    Ok((offered.len() != options.protocols.len()).then(|| Options {
        protocols: offered,
        ..options.clone()
    }))
}

/// Whether a candidate is one of NCCL's simulated families (costed at every protocol, every
/// time read: the baseline is their best under NCCL's protocol).
pub(super) type Whole<'a> = dyn Fn(&Costed) -> bool + 'a;

/// A costed candidate.
#[derive(Clone)]
pub(super) struct Costed {
    pub(super) candidate: Candidate,
    /// Whether `--algo` allows it to win (baseline-only candidates do not).
    pub(super) selectable: bool,
    /// `times[p][s]`: predicted µs under `protocols[p]` at `sizes[s]` (None: not costable).
    pub(super) times: Vec<Option<Vec<f64>>>,
    /// `exact[s]`: whether `times[·][s]` were simulated rather than interpolated.
    pub(super) exact: Vec<bool>,
    /// Whether some time was left infinite for being past its size's limit (the cost
    /// phase's second wave; [`super::costing::complete`] fills them in).
    pub(super) limited: bool,
    /// `(size index, protocol index)` runs the refine phase stopped past their size's best
    /// time (left infinite: they could not win there); [`super::refine::uncut`] runs them
    /// to their end where a time is read after all.
    pub(super) cut: Vec<(usize, usize)>,
    pub(super) verified: Option<bool>,
}
