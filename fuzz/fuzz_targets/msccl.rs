#![no_main]
//! MSCCL XML import (then verification and export), see `hccl_ir::fuzz::msccl`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    hccl_ir::fuzz::msccl(data);
});
