//! RDMA transport (feature `rdma`): device discovery and selection (`HCCL_IB_HCA`).

use super::{Inner, NetConfig, NetKind};
use super::proto::Seg;

/// Finds the RDMA device `HCCL_IB_HCA` names (a name prefix, optionally `:port`), or the
/// first device; `Err` says why there is none.
pub fn probe(hca: Option<&str>) -> Result<String, String> {
    let list = ibverbs::devices().map_err(|e| format!("no RDMA devices: {e}"))?;
    let want = hca.map(|h| h.split(':').next().unwrap_or(h).to_string());
    for dev in list.iter() {
        let name = dev
            .name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if want.as_deref().is_none_or(|w| name.starts_with(w)) {
            return Ok(name);
        }
    }
    Err(match hca {
        Some(h) => format!("no RDMA device matches HCCL_IB_HCA={h}"),
        None => "no RDMA devices".into(),
    })
}

/// Queue pairs to every peer of a rank (to be written).
pub(crate) struct Links {}

impl Links {
    /// Chooses the transport: `Ok(None)` means TCP.
    pub(crate) fn establish(inner: &Inner, cfg: &NetConfig) -> Result<Option<Links>, String> {
        match (cfg.kind, probe(cfg.ib_hca.as_deref())) {
            (NetKind::Ib, Err(why)) => Err(format!("HCCL_NET=ib: {why}")),
            (NetKind::Auto, Err(why)) => {
                tracing::info!(rank = inner.me, "no RDMA ({why}); using TCP");
                Ok(None)
            }
            (NetKind::Socket, _) => Ok(None),
            (_, Ok(dev)) => Err(format!("RDMA device {dev} found but the RDMA transport is not written yet")),
        }
    }

    pub(crate) fn send(&self, _inner: &Inner, _p: usize, _c: u32, _seq: u64, _segs: &[Seg]) -> std::io::Result<()> {
        Err(std::io::Error::other("unimplemented"))
    }

    pub(crate) fn credit(&self, _inner: &Inner, _p: usize, _c: u32, _consumed: u64) {}
}
