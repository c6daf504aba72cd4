//! Which RDMA device and GID a rank uses: `HCCL_IB_HCA`, the probe, the GID choice.

use ibverbs::{Context, Gid, GidEntry};

/// The port the `ibverbs` crate uses.
pub(super) const PORT: u32 = 1;
/// `ibv_gid_type` values (not re-exported by the crate).
pub(super) const GID_TYPE_IB: u32 = 0;
pub(super) const GID_TYPE_ROCE_V2: u32 = 2;

/// What `HCCL_IB_HCA` asks for: a device name prefix (or exact name) and a port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct HcaSpec {
    name: Option<String>,
    exact: bool,
}

/// Parses `HCCL_IB_HCA` (`mlx5`, `mlx5_0:1`, `=mlx5_0`); only port 1 is drivable.
pub(super) fn parse_hca(hca: Option<&str>) -> Result<HcaSpec, String> {
    let Some(raw) = hca.map(str::trim).filter(|h| !h.is_empty()) else {
        return Ok(HcaSpec {
            name: None,
            exact: false,
        });
    };
    let (exact, rest) = match raw.strip_prefix('=') {
        Some(r) => (true, r),
        None => (false, raw),
    };
    let (name, port) = match rest.split_once(':') {
        Some((n, p)) => (n, Some(p)),
        None => (rest, None),
    };
    if name.is_empty() || name.contains(',') || name.starts_with('^') {
        return Err(format!(
            "HCCL_IB_HCA={raw}: expected one device name or prefix, optionally =exact and :port"
        ));
    }
    if let Some(p) = port {
        match p.trim().parse::<u32>() {
            Ok(PORT) => {}
            Ok(n) => {
                return Err(format!(
                    "HCCL_IB_HCA={raw}: port {n}, but the ibverbs crate drives port {PORT} only"
                ));
            }
            Err(_) => return Err(format!("HCCL_IB_HCA={raw}: {p:?} is not a port number")),
        }
    }
    Ok(HcaSpec {
        name: Some(name.to_string()),
        exact,
    })
}

impl HcaSpec {
    pub(super) fn matches(&self, dev: &str) -> bool {
        match &self.name {
            None => true,
            Some(n) if self.exact => dev == n,
            Some(n) => dev.starts_with(n.as_str()),
        }
    }
}

/// Finds the RDMA device `HCCL_IB_HCA` names (a name prefix, optionally `:port`), or the
/// first device; `Err` says why there is none.
pub fn probe(hca: Option<&str>) -> Result<String, String> {
    let spec = parse_hca(hca)?;
    let list = ibverbs::devices().map_err(|e| format!("no RDMA devices: {e}"))?;
    for dev in list.iter() {
        let name = dev
            .name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if spec.matches(&name) {
            return Ok(name);
        }
    }
    Err(match hca {
        Some(h) => format!("no RDMA device matches HCCL_IB_HCA={h}"),
        None => "no RDMA devices".into(),
    })
}

/// Opens the device [`probe`] would choose.
pub(super) fn open_device(hca: Option<&str>) -> Result<(String, Context), String> {
    let spec = parse_hca(hca)?;
    let list = ibverbs::devices().map_err(|e| format!("no RDMA devices: {e}"))?;
    let mut tried = Vec::new();
    for dev in list.iter() {
        let name = dev
            .name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if !spec.matches(&name) {
            continue;
        }
        match dev.open() {
            Ok(ctx) => return Ok((name, ctx)),
            Err(e) => tried.push(format!("{name}: {e}")),
        }
    }
    Err(match (hca, tried.is_empty()) {
        (_, false) => format!("no usable RDMA device ({})", tried.join("; ")),
        (Some(h), true) => format!("no RDMA device matches HCCL_IB_HCA={h}"),
        (None, true) => "no RDMA devices".into(),
    })
}

/// The 16 bytes of a GID, in network order.
pub(super) fn gid_bytes(g: &Gid) -> [u8; 16] {
    let mut out = [0u8; 16];
    out[..8].copy_from_slice(&g.subnet_prefix().to_be_bytes());
    out[8..].copy_from_slice(&g.interface_id().to_be_bytes());
    out
}

/// A GID from its 16 bytes.
pub(super) fn gid_from(bytes: [u8; 16]) -> Gid {
    let mut g = Gid::default();
    // Writing a `Copy` field of the `ibv_gid` union is safe.
    g.as_mut().raw = bytes;
    g
}

/// The GID table index to route with: on port 1, a RoCE v2 GID holding an IPv4 address, else
/// any RoCE v2 GID, else an InfiniBand GID, else the first; `None` for an empty table. Only
/// entries whose index equals their position qualify (the crate indexes the table by it).
pub(super) fn choose_gid(table: &[GidEntry]) -> Option<u32> {
    let usable: Vec<&GidEntry> = table
        .iter()
        .enumerate()
        .filter(|(i, e)| e.gid_index as usize == *i && e.port_num == PORT)
        .map(|(_, e)| e)
        .collect();
    let ipv4 = |e: &&GidEntry| e.gid.subnet_prefix() == 0 && e.gid.interface_id() >> 32 == 0xffff;
    let v2 = |e: &&GidEntry| e.gid_type == GID_TYPE_ROCE_V2;
    usable
        .iter()
        .find(|e| v2(e) && ipv4(e))
        .or_else(|| usable.iter().find(|e| v2(e)))
        .or_else(|| usable.iter().find(|e| e.gid_type == GID_TYPE_IB))
        .or_else(|| usable.first())
        .map(|e| e.gid_index)
}
