//! Entry point for the fuzz target `topology` in `fuzz/` (cargo fuzz) and for the test that
//! replays its corpus. Not part of the API.

use crate::{analysis, parse};

/// Reads `bytes` as a topology file; returns whether it was accepted. Malformed input is an
/// error, never a panic. An accepted topology must hold the `Topology` invariant (every
/// device reaches every other with finite positive bandwidth), its canonical text must read
/// again to the same topology (same hash), and small ones go through the analyses that
/// `hcclc topo show` prints.
pub fn topology(bytes: &[u8]) -> bool {
    let Ok(topo) = parse::from_bytes(bytes, "fuzz.ron") else {
        return false;
    };
    let text = parse::to_ron(&topo.spec);
    let again = parse::from_ron(&text, "fuzz-again.ron")
        .unwrap_or_else(|e| panic!("a topology written again does not read: {e}\n{text}"));
    assert_eq!(
        again.hash, topo.hash,
        "a topology read again hashes otherwise"
    );
    for edge in topo.graph.edge_weights() {
        assert!(
            edge.bw.is_finite() && edge.bw > 0.0 && edge.latency.is_finite() && edge.latency >= 0.0,
            "an accepted topology has a link of {} GB/s, {} us",
            edge.bw,
            edge.latency
        );
    }
    if topo.nranks() <= 8 && topo.graph.node_count() <= 64 {
        let _ = analysis::summarize(&topo);
        let _ = crate::dot::to_dot(&topo);
    }
    true
}
