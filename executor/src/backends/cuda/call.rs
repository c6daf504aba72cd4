//! What a CUDA group is asked to run: which device each rank uses ([`DeviceMap`]) and the
//! calls ([`Call`], and [`VCall`] for an AllToAllv).

use super::lower::{self, BlockLayout};
use crate::dtype::{DataType, ReduceOp};
use hccl_ir::{Collective, CollectiveKind};

/// Which device (CUDA ordinal) each rank runs on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceMap {
    pub(super) ordinals: Vec<usize>,
}

impl DeviceMap {
    /// `nranks` ranks sharing device `ordinal`.
    pub fn single(ordinal: usize, nranks: u32) -> DeviceMap {
        DeviceMap {
            ordinals: vec![ordinal; nranks as usize],
        }
    }

    /// Rank `r` on device `r`.
    pub fn one_per_device(nranks: u32) -> DeviceMap {
        DeviceMap {
            ordinals: (0..nranks as usize).collect(),
        }
    }

    /// An explicit device per rank.
    pub fn per_rank(ordinals: Vec<usize>) -> DeviceMap {
        DeviceMap { ordinals }
    }

    /// The device of every rank.
    pub fn ordinals(&self) -> &[usize] {
        &self.ordinals
    }
}

/// One collective call of a group: what the plan is looked up with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Call {
    pub collective: Collective,
    pub dtype: DataType,
    /// Ignored by collectives that do not reduce.
    pub op: ReduceOp,
    /// `N`: elements of the whole collective buffer (nccl-tests size / element size):
    /// AllGather's whole output, ReduceScatter's whole input, what one rank sends in AllToAll.
    pub count: usize,
    pub in_place: bool,
}

impl Call {
    /// Bytes of the collective buffer (the plan's size key).
    pub fn bytes(&self) -> u64 {
        (self.count * self.dtype.size()) as u64
    }

    pub(super) fn shape(&self) -> lower::CallShape {
        lower::CallShape {
            collective: self.collective,
            op: if self.collective.kind().reduces() {
                self.op
            } else {
                ReduceOp::Sum
            },
            esize: self.dtype.size(),
            total: self.count,
            in_place: self.in_place,
        }
    }

    /// Element offsets and lengths of `rank`'s input and output inside its buffers:
    /// `(input in recv buffer?, input offset, input len, output offset, output len)`.
    pub(super) fn layout(&self, rank: u32, nranks: u32) -> (bool, usize, usize, usize, usize) {
        let shape = self.shape();
        let (inl, outl) = shape.extents(nranks);
        let blk = self.count / nranks.max(1) as usize;
        let r_off = rank as usize * blk;
        match (self.in_place, self.collective.kind()) {
            (true, CollectiveKind::AllGather) => (true, r_off, inl, 0, outl),
            (true, CollectiveKind::ReduceScatter) => (true, 0, inl, r_off, outl),
            (true, _) => (true, 0, inl, 0, outl),
            (false, _) => (false, 0, inl, 0, outl),
        }
    }
}

/// An AllToAllv of a group: the element type and every rank's blocks (see
/// [`BlockLayout`]). Rank `r`'s input holds [`BlockLayout::send_len`]`(r)` elements and its
/// output [`BlockLayout::recv_len`]`(r)`; zero counts are allowed.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct VCall {
    pub dtype: DataType,
    pub layout: BlockLayout,
}
