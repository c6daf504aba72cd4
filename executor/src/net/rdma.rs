//! RDMA transport (feature `rdma`): device discovery and selection (`HCCL_IB_HCA`).

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
