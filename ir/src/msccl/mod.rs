//! MSCCL XML algorithm files: import into the IR and export from it.
//!
//! MSCCL's XML (written by msccl-tools, executed by the MSCCL runtime) maps almost one to one
//! onto the IR: `<gpu>` is a [`RankProgram`], `<tb>` a [`Stream`] whose index is the tb id,
//! `<step>` a [`Step`] whose type letters are the [`Op`] mnemonics, `depid/deps` a [`Dep`] and
//! `nchunksperloop` the schedule's chunk count. `/work/shared/msccl/FORMAT.md` in the project's
//! shared material describes the format; the points where a reader has to decide are:
//!
//! - **Peers.** A tb has one send and one receive peer; every send-type step goes to `send`,
//!   every receive-type step comes from `recv`. Import copies them onto each step.
//! - **Remote-side fields.** Fields a step type does not use (the `dst` of a send, the `src` of
//!   a receive) describe the other side of the transfer. They are informational and ignored.
//! - **`nop`** steps are kept as [`Op::Nop`] carrying their dependency, which is exactly the
//!   runtime's "wait for all of these before the next step".
//! - **`hasdep`** is derived data (the runtime only publishes completion of flagged steps).
//!   Import checks it against the dependencies and reports mismatches as warnings, because
//!   the MSCCL runtime would hang on a dependency whose target is not flagged.
//! - **In-place and out-of-place.** A file marked for both becomes two plan entries, one per
//!   placement, each verified on its own; a file marked for one is imported for that one.
//! - **Legacy files** (original msccl-tools) lack `outofplace`, `minBytes` and `maxBytes`. They
//!   are read with the old runtime's defaults: `outofplace = !inplace`, `minBytes = 0` and no
//!   upper bound (the old runtime capped a missing `maxBytes` at 128 MiB; we do not), and the
//!   import reports that it applied them.
//! - `coll="reduce_scatter"` (the synthesizer's spelling) is read as `reducescatter`.
//!   `broadcast` and `reduce` carry no root in the format; root 0 is assumed and reported.
//! - Sizes: `minBytes ≤ size ≤ maxBytes` (inclusive, `maxBytes = 0` unbounded) becomes
//!   `min_bytes..max_bytes + 1`.
//!
//! Everything else in a file is either used or rejected: unknown elements or attributes, text
//! content, missing attributes and values of the wrong type are errors naming the line and
//! column. Semantic problems (a send without a matching receive, a wrong result) are left to
//! [`crate::verify`], which names the rank, tb (stream) and step.

mod export;

pub use export::{ExportError, export_xml};

use crate::plan::{PlanEntry, PlanFile, PlanMeta, Protocol};
use crate::schedule::{
    Buf, Collective, CollectiveKind, Dep, Loc, Op, RankProgram, Schedule, Step, Stream,
};
use roxmltree::{Document, Node, ParsingOptions};
use std::collections::HashMap;
use thiserror::Error;

/// A file that is not a readable MSCCL algorithm.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{path}:{line}:{col}: {message}")]
pub struct MscclError {
    pub path: String,
    pub line: u32,
    pub col: u32,
    pub message: String,
}

/// The result of importing one XML file.
#[derive(Debug, Clone, PartialEq)]
pub struct Imported {
    /// One entry per placement the file allows (in-place, out-of-place or both).
    pub entries: Vec<PlanEntry>,
    /// `nchannels` as declared (the IR derives channels from the streams).
    pub declared_channels: u32,
    /// Things the import decided or noticed that a user should know.
    pub warnings: Vec<String>,
}

impl Imported {
    /// A plan file holding the imported entries.
    pub fn into_plan(self, origin: &str) -> PlanFile {
        let mut plan = PlanFile::new(PlanMeta {
            topology: String::new(),
            topology_hash: String::new(),
            compiler: format!("msccl import of {origin}"),
        });
        plan.entries = self.entries;
        plan
    }
}

/// Largest step count, tb count, rank count and chunk count accepted: far beyond any real
/// file, small enough that hostile numbers cannot make the import allocate without bound.
const MAX_RANKS: u32 = 1 << 16;
const MAX_CHUNKS: u32 = 1 << 24;
const MAX_NODES: u32 = 20_000_000;

/// Imports MSCCL XML text; `origin` (a path) names the file in errors.
pub fn import_xml(text: &str, origin: &str) -> Result<Imported, MscclError> {
    let options = ParsingOptions {
        allow_dtd: false,
        nodes_limit: MAX_NODES,
        ..ParsingOptions::default()
    };
    let doc = Document::parse_with_options(text, options).map_err(|err| {
        let pos = err.pos();
        MscclError {
            path: origin.to_string(),
            line: pos.row,
            col: pos.col,
            message: format!("not well-formed XML: {err}"),
        }
    })?;
    Importer {
        doc: &doc,
        origin,
        warnings: Vec::new(),
    }
    .run()
}

/// Reads and imports an XML file.
pub fn load_xml(path: &std::path::Path) -> Result<Imported, MscclError> {
    let origin = path.display().to_string();
    let fail = |message: String| MscclError {
        path: origin.clone(),
        line: 1,
        col: 1,
        message,
    };
    let bytes = std::fs::read(path).map_err(|err| fail(format!("cannot read file: {err}")))?;
    let text = std::str::from_utf8(&bytes).map_err(|err| {
        fail(format!(
            "not a text file (invalid UTF-8 at byte {})",
            err.valid_up_to()
        ))
    })?;
    import_xml(text, &origin)
}

/// The attributes of `<algo>`, checked.
struct AlgoHeader {
    name: String,
    protocol: Protocol,
    nchannels: u32,
    chunks: u32,
    nranks: u32,
    collective: Collective,
    input_chunks: u32,
    output_chunks: u32,
    inplace: bool,
    outofplace: bool,
    min_bytes: u64,
    max_bytes: Option<u64>,
}

struct Importer<'a, 'input> {
    doc: &'a Document<'input>,
    origin: &'a str,
    warnings: Vec<String>,
}

type Res<T> = Result<T, MscclError>;

impl<'a, 'input> Importer<'a, 'input> {
    fn error_at(&self, pos: usize, message: impl Into<String>) -> MscclError {
        let at = self.doc.text_pos_at(pos);
        MscclError {
            path: self.origin.to_string(),
            line: at.row,
            col: at.col,
            message: message.into(),
        }
    }

    fn error(&self, node: Node, message: impl Into<String>) -> MscclError {
        self.error_at(node.range().start, message)
    }

    /// Rejects attributes outside `allowed` and non-whitespace text among the children.
    fn check_shape(&self, node: Node, allowed: &[&str]) -> Res<()> {
        for attr in node.attributes() {
            if !allowed.contains(&attr.name()) {
                return Err(self.error_at(
                    attr.range().start,
                    format!(
                        "unknown attribute `{}` on <{}> (known: {})",
                        attr.name(),
                        node.tag_name().name(),
                        allowed.join(", ")
                    ),
                ));
            }
        }
        for child in node.children() {
            if child.is_text() && !child.text().unwrap_or("").trim().is_empty() {
                return Err(self.error(child, "unexpected text content"));
            }
        }
        Ok(())
    }

    fn attr<'n>(&self, node: Node<'n, 'input>, name: &str) -> Res<&'n str> {
        node.attribute(name).ok_or_else(|| {
            self.error(
                node,
                format!(
                    "<{}> lacks required attribute `{name}`",
                    node.tag_name().name()
                ),
            )
        })
    }

    fn int_attr(&self, node: Node, name: &str) -> Res<i64> {
        let raw = self.attr(node, name)?;
        self.parse_int(node, name, raw)
    }

    fn parse_int(&self, node: Node, name: &str, raw: &str) -> Res<i64> {
        raw.trim().parse::<i64>().map_err(|_| {
            let pos = node
                .attributes()
                .find(|a| a.name() == name)
                .map_or(node.range().start, |a| a.range_value().start);
            self.error_at(
                pos,
                format!("attribute `{name}` must be an integer, found {raw:?}"),
            )
        })
    }

    /// An integer attribute that must lie in `lo..=hi`.
    fn ranged(&self, node: Node, name: &str, lo: i64, hi: i64) -> Res<i64> {
        let value = self.int_attr(node, name)?;
        if value < lo || value > hi {
            return Err(self.error(
                node,
                format!("attribute `{name}` = {value} is outside {lo}..={hi}"),
            ));
        }
        Ok(value)
    }

    fn flag(&self, node: Node, name: &str) -> Res<Option<bool>> {
        match node.attribute(name) {
            None => Ok(None),
            Some(_) => Ok(Some(self.ranged(node, name, 0, 1)? == 1)),
        }
    }

    fn elements<'n>(&self, node: Node<'n, 'input>, tag: &str) -> Res<Vec<Node<'n, 'input>>> {
        let mut res = Vec::new();
        for child in node.children().filter(|c| c.is_element()) {
            if child.tag_name().name() != tag {
                return Err(self.error(
                    child,
                    format!(
                        "unexpected element <{}> inside <{}> (expected <{tag}>)",
                        child.tag_name().name(),
                        node.tag_name().name()
                    ),
                ));
            }
            res.push(child);
        }
        Ok(res)
    }

    fn run(mut self) -> Res<Imported> {
        let algo = self.doc.root_element();
        let h = self.algo_header(algo)?;
        let ranks = self.programs(algo, h.nranks, h.nchannels)?;
        let mut entries = Vec::new();
        for in_place in [true, false] {
            if (in_place && !h.inplace) || (!in_place && !h.outofplace) {
                continue;
            }
            entries.push(PlanEntry {
                min_bytes: h.min_bytes,
                max_bytes: h.max_bytes,
                algorithm: h.name.clone(),
                protocol: h.protocol,
                cost: None,
                symmetry: None,
                synthesis: None,
                schedule: Schedule {
                    collective: h.collective,
                    nranks: h.nranks,
                    chunks: h.chunks,
                    input_chunks: h.input_chunks,
                    output_chunks: h.output_chunks,
                    in_place,
                    ranks: ranks.clone(),
                },
                template: None,
            });
        }
        Ok(Imported {
            entries,
            declared_channels: h.nchannels,
            warnings: self.warnings,
        })
    }

    /// The `<algo>` element's attributes, checked, with a warning for each legacy default.
    fn algo_header(&mut self, algo: Node<'a, 'input>) -> Res<AlgoHeader> {
        if algo.tag_name().name() != "algo" {
            return Err(self.error(
                algo,
                format!(
                    "root element is <{}>, expected <algo>",
                    algo.tag_name().name()
                ),
            ));
        }
        self.check_shape(
            algo,
            &[
                "name",
                "proto",
                "nchannels",
                "nchunksperloop",
                "ngpus",
                "coll",
                "inplace",
                "outofplace",
                "minBytes",
                "maxBytes",
                "nthreads",
            ],
        )?;
        let name = algo.attribute("name").unwrap_or("msccl").to_string();
        let proto_raw = self.attr(algo, "proto")?;
        let protocol = Protocol::from_name(proto_raw).ok_or_else(|| {
            self.error(
                algo,
                format!("unknown proto {proto_raw:?} (expected Simple, LL or LL128)"),
            )
        })?;
        let nchannels = self.ranged(algo, "nchannels", 0, i64::from(u32::MAX))? as u32;
        let chunks = self.ranged(algo, "nchunksperloop", 1, i64::from(MAX_CHUNKS))? as u32;
        let nranks = self.ranged(algo, "ngpus", 1, i64::from(MAX_RANKS))? as u32;
        let coll_raw = self.attr(algo, "coll")?;
        let kind = CollectiveKind::from_name(coll_raw).ok_or_else(|| {
            self.error(
                algo,
                format!(
                    "unsupported coll {coll_raw:?} (supported: allreduce, allgather, reducescatter, broadcast, reduce, alltoall)"
                ),
            )
        })?;
        if coll_raw == "reduce_scatter" {
            self.warnings
                .push("coll=\"reduce_scatter\" (legacy name) read as reducescatter".into());
        }
        let collective = match kind {
            CollectiveKind::AllReduce => Collective::AllReduce,
            CollectiveKind::AllGather => Collective::AllGather,
            CollectiveKind::ReduceScatter => Collective::ReduceScatter,
            CollectiveKind::AllToAll => Collective::AllToAll,
            CollectiveKind::Broadcast => {
                self.warnings
                    .push("broadcast carries no root in MSCCL XML; root 0 assumed".into());
                Collective::Broadcast { root: 0 }
            }
            CollectiveKind::Reduce => {
                self.warnings
                    .push("reduce carries no root in MSCCL XML; root 0 assumed".into());
                Collective::Reduce { root: 0 }
            }
        };
        let Some((input_chunks, output_chunks)) = collective.buffer_chunks(nranks, chunks) else {
            return Err(self.error(
                algo,
                format!("nchunksperloop = {chunks} is not a multiple of ngpus = {nranks}, as {kind} requires"),
            ));
        };
        let inplace = self
            .flag(algo, "inplace")?
            .ok_or_else(|| self.error(algo, "<algo> lacks required attribute `inplace`"))?;
        let outofplace = match self.flag(algo, "outofplace")? {
            Some(v) => v,
            None => {
                self.warnings.push(format!(
                    "legacy format: `outofplace` missing, read as {} (= not inplace)",
                    u8::from(!inplace)
                ));
                !inplace
            }
        };
        let min_bytes = match algo.attribute("minBytes") {
            Some(_) => self.ranged(algo, "minBytes", 0, i64::MAX)? as u64,
            None => {
                self.warnings
                    .push("legacy format: `minBytes` missing, read as 0".into());
                0
            }
        };
        let max_bytes = match algo.attribute("maxBytes") {
            Some(_) => match self.ranged(algo, "maxBytes", 0, i64::MAX - 1)? {
                0 => None,
                max => Some(max as u64 + 1),
            },
            None => {
                self.warnings
                    .push("legacy format: `maxBytes` missing, read as unbounded".into());
                None
            }
        };
        if !inplace && !outofplace {
            return Err(self.error(
                algo,
                "inplace=\"0\" and outofplace=\"0\": the algorithm can never run",
            ));
        }

        Ok(AlgoHeader {
            name,
            protocol,
            nchannels,
            chunks,
            nranks,
            collective,
            input_chunks,
            output_chunks,
            inplace,
            outofplace,
            min_bytes,
            max_bytes,
        })
    }

    /// One program per rank, from the `<gpu>` elements (each rank exactly once).
    fn programs(
        &mut self,
        algo: Node<'a, 'input>,
        nranks: u32,
        nchannels: u32,
    ) -> Res<Vec<RankProgram>> {
        let gpus = self.elements(algo, "gpu")?;
        let mut programs: Vec<Option<RankProgram>> = vec![None; nranks as usize];
        let mut max_channel = 0u32;
        for gpu in gpus {
            let (rank, program) = self.gpu(gpu, nranks)?;
            if let Some(stream_max) = program.streams.iter().map(|s| s.channel + 1).max() {
                max_channel = max_channel.max(stream_max);
            }
            if programs[rank as usize].is_some() {
                return Err(self.error(gpu, format!("duplicate <gpu id=\"{rank}\">")));
            }
            programs[rank as usize] = Some(program);
        }
        let missing: Vec<String> = programs
            .iter()
            .enumerate()
            .filter(|(_, p)| p.is_none())
            .map(|(r, _)| r.to_string())
            .collect();
        if !missing.is_empty() {
            return Err(self.error(
                algo,
                format!(
                    "ngpus = {nranks} but no <gpu> for rank(s) {}",
                    missing.join(", ")
                ),
            ));
        }
        if max_channel != nchannels {
            self.warnings.push(format!(
                "nchannels = {nchannels} but the thread blocks use {max_channel} channel(s)"
            ));
        }
        Ok(programs.into_iter().flatten().collect())
    }

    fn gpu(&mut self, gpu: Node, nranks: u32) -> Res<(u32, RankProgram)> {
        self.check_shape(gpu, &["id", "i_chunks", "o_chunks", "s_chunks"])?;
        let rank = self.ranged(gpu, "id", 0, i64::from(nranks) - 1)? as u32;
        // i_chunks and o_chunks are what the program touches; bounds are checked by the
        // verifier against the collective's extents, so they are read only for validity.
        self.ranged(gpu, "i_chunks", 0, i64::from(MAX_CHUNKS))?;
        self.ranged(gpu, "o_chunks", 0, i64::from(MAX_CHUNKS))?;
        let scratch_chunks = self.ranged(gpu, "s_chunks", 0, i64::from(MAX_CHUNKS))? as u32;
        let tbs = self.elements(gpu, "tb")?;
        let mut by_id: Vec<Option<Stream>> = vec![None; tbs.len()];
        let mut hasdep_flags: HashMap<(u32, u32), bool> = HashMap::new();
        for tb in &tbs {
            let id = self.ranged(*tb, "id", 0, i64::from(u32::MAX))?;
            let slot = usize::try_from(id)
                .ok()
                .filter(|&i| i < by_id.len())
                .ok_or_else(|| {
                    self.error(
                        *tb,
                        format!(
                            "gpu {rank}: tb id {id} is not dense (this gpu has {} tbs, ids must be 0..{})",
                            tbs.len(),
                            tbs.len()
                        ),
                    )
                })?;
            if by_id[slot].is_some() {
                return Err(self.error(*tb, format!("gpu {rank}: duplicate tb id {id}")));
            }
            let stream = self.tb(*tb, rank, id as u32, &mut hasdep_flags)?;
            by_id[slot] = Some(stream);
        }
        let streams: Vec<Stream> = by_id.into_iter().flatten().collect();
        // hasdep must flag exactly the steps other tbs wait on.
        let mut waited: HashMap<(u32, u32), ()> = HashMap::new();
        for stream in &streams {
            for step in &stream.steps {
                for dep in &step.deps {
                    waited.insert((dep.stream, dep.step), ());
                }
            }
        }
        let mut unflagged: Vec<(u32, u32)> = waited
            .keys()
            .filter(|k| hasdep_flags.get(k) == Some(&false))
            .copied()
            .collect();
        unflagged.sort_unstable();
        for (tb, step) in unflagged {
            self.warnings.push(format!(
                "gpu {rank} tb {tb} step {tb_step}: other steps wait on it but hasdep=\"0\" (the MSCCL runtime would hang)",
                tb_step = step
            ));
        }
        Ok((
            rank,
            RankProgram {
                scratch_chunks,
                streams,
            },
        ))
    }

    fn tb(
        &mut self,
        tb: Node,
        rank: u32,
        id: u32,
        hasdep_flags: &mut HashMap<(u32, u32), bool>,
    ) -> Res<Stream> {
        self.check_shape(tb, &["id", "send", "recv", "chan"])?;
        let send = self.ranged(tb, "send", -1, i64::from(u32::MAX))?;
        let recv = self.ranged(tb, "recv", -1, i64::from(u32::MAX))?;
        let channel = self.ranged(tb, "chan", 0, i64::from(u32::MAX))? as u32;
        let mut steps = Vec::new();
        for (pos, node) in self.elements(tb, "step")?.into_iter().enumerate() {
            self.check_shape(
                node,
                &[
                    "s", "type", "srcbuf", "srcoff", "dstbuf", "dstoff", "cnt", "depid", "deps",
                    "hasdep",
                ],
            )?;
            let s = self.int_attr(node, "s")?;
            if s != pos as i64 {
                return Err(self.error(
                    node,
                    format!(
                        "gpu {rank} tb {id}: step s=\"{s}\" is at position {pos}; steps must be numbered in order from 0"
                    ),
                ));
            }
            let step = self.step(node, rank, id, send, recv)?;
            if let Some(flag) = self.flag(node, "hasdep")? {
                hasdep_flags.insert((id, pos as u32), flag);
            }
            steps.push(step);
        }
        Ok(Stream { channel, steps })
    }

    fn buf(&self, node: Node, name: &str) -> Res<Buf> {
        match self.attr(node, name)? {
            "i" => Ok(Buf::Input),
            "o" => Ok(Buf::Output),
            "s" => Ok(Buf::Scratch),
            other => Err(self.error(
                node,
                format!("attribute `{name}` must be i, o or s, found {other:?}"),
            )),
        }
    }

    /// The location named by `{which}buf` / `{which}off`, which the step type uses.
    fn loc(&self, node: Node, which: &str) -> Res<Loc> {
        let buf = self.buf(node, &format!("{which}buf"))?;
        let off_name = format!("{which}off");
        let off = self.int_attr(node, &off_name)?;
        let off = u32::try_from(off).map_err(|_| {
            self.error(
                node,
                format!("`{off_name}` = {off}, but this step type reads or writes that location"),
            )
        })?;
        Ok(Loc { buf, off })
    }

    fn peer(&self, node: Node, peer: i64, what: &str, rank: u32, tb: u32) -> Res<u32> {
        u32::try_from(peer).map_err(|_| {
            self.error(
                node,
                format!(
                    "gpu {rank} tb {tb}: step {what}s but the tb has {what}=\"-1\" (no {what} peer)"
                ),
            )
        })
    }

    fn step(&self, node: Node, rank: u32, tb: u32, send: i64, recv: i64) -> Res<Step> {
        let kind = self.attr(node, "type")?;
        let count = self.ranged(node, "cnt", 0, i64::from(u32::MAX))? as u32;
        let to = || self.peer(node, send, "send", rank, tb);
        let from = || self.peer(node, recv, "recv", rank, tb);
        let src = || self.loc(node, "src");
        let dst = || self.loc(node, "dst");
        let op = match kind {
            "s" => Op::Send {
                to: to()?,
                src: src()?,
            },
            "r" => Op::Recv {
                from: from()?,
                dst: dst()?,
            },
            "rcs" => Op::RecvCopySend {
                from: from()?,
                to: to()?,
                dst: dst()?,
            },
            "rrs" => Op::RecvReduceSend {
                from: from()?,
                to: to()?,
                src: src()?,
            },
            "rrc" => Op::RecvReduceCopy {
                from: from()?,
                src: src()?,
                dst: dst()?,
            },
            "rrcs" => Op::RecvReduceCopySend {
                from: from()?,
                to: to()?,
                src: src()?,
                dst: dst()?,
            },
            "cpy" => Op::Copy {
                src: src()?,
                dst: dst()?,
            },
            "re" => Op::Reduce {
                src: src()?,
                dst: dst()?,
            },
            "nop" => Op::Nop,
            other => {
                return Err(self.error(
                    node,
                    format!(
                        "unknown step type {other:?} (known: s, r, rcs, rrs, rrc, rrcs, cpy, re, nop)"
                    ),
                ));
            }
        };
        // Required on every step, even where unused (the runtime reads them all).
        self.buf(node, "srcbuf")?;
        self.buf(node, "dstbuf")?;
        self.int_attr(node, "srcoff")?;
        self.int_attr(node, "dstoff")?;
        let depid = self.ranged(node, "depid", -1, i64::from(u32::MAX))?;
        let deps = self.ranged(node, "deps", -1, i64::from(u32::MAX))?;
        let mut step = Step::new(op, if matches!(op, Op::Nop) { 0 } else { count });
        match (depid, deps) {
            (-1, _) => {}
            (_, -1) => {
                return Err(self.error(
                    node,
                    format!("depid = {depid} but deps = -1: a dependency needs both"),
                ));
            }
            (stream, step_idx) => step.deps.push(Dep {
                stream: stream as u32,
                step: step_idx as u32,
            }),
        }
        Ok(step)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RING4: &str = r#"<algo name="ring4" proto="Simple" nchannels="1" nchunksperloop="4" ngpus="2" coll="allgather" inplace="1" outofplace="0" minBytes="0" maxBytes="0">
  <gpu id="0" i_chunks="0" o_chunks="4" s_chunks="0">
    <tb id="0" send="1" recv="1" chan="0">
      <step s="0" type="s" srcbuf="o" srcoff="0" dstbuf="o" dstoff="0" cnt="2" depid="-1" deps="-1" hasdep="0"/>
      <step s="1" type="r" srcbuf="o" srcoff="2" dstbuf="o" dstoff="2" cnt="2" depid="-1" deps="-1" hasdep="0"/>
    </tb>
  </gpu>
  <gpu id="1" i_chunks="0" o_chunks="4" s_chunks="0">
    <tb id="0" send="0" recv="0" chan="0">
      <step s="0" type="s" srcbuf="o" srcoff="2" dstbuf="o" dstoff="2" cnt="2" depid="-1" deps="-1" hasdep="0"/>
      <step s="1" type="r" srcbuf="o" srcoff="0" dstbuf="o" dstoff="0" cnt="2" depid="-1" deps="-1" hasdep="0"/>
    </tb>
  </gpu>
</algo>"#;

    #[test]
    fn imports_a_small_allgather() {
        let imported = import_xml(RING4, "ring4.xml").unwrap();
        assert_eq!(imported.entries.len(), 1);
        let entry = &imported.entries[0];
        assert!(entry.schedule.in_place);
        assert_eq!(entry.schedule.input_chunks, 2);
        assert_eq!(
            entry.schedule.ranks[1].streams[0].steps[0].op,
            Op::Send {
                to: 0,
                src: Loc::output(2)
            }
        );
        assert!(imported.warnings.is_empty(), "{:?}", imported.warnings);
    }

    #[test]
    fn errors_are_located() {
        let bad = RING4.replace(
            "type=\"r\" srcbuf=\"o\" srcoff=\"2\"",
            "type=\"rx\" srcbuf=\"o\" srcoff=\"2\"",
        );
        let err = import_xml(&bad, "bad.xml").unwrap_err();
        assert_eq!((err.line, err.path.as_str()), (5, "bad.xml"));
        assert!(err.message.contains("unknown step type"), "{err}");

        let truncated = &RING4[..RING4.len() / 2];
        let err = import_xml(truncated, "t.xml").unwrap_err();
        assert!(err.message.contains("not well-formed"), "{err}");

        let extra = RING4.replace(
            "<tb id=\"0\" send=\"1\"",
            "<tb id=\"0\" colour=\"red\" send=\"1\"",
        );
        let err = import_xml(&extra, "x.xml").unwrap_err();
        assert!(err.message.contains("unknown attribute `colour`"), "{err}");
        assert_eq!(err.line, 3);
    }
}
