#![no_main]
//! The plan loader: full, compact and partial loads of every format version, then the
//! verifier, see `hccl_ir::fuzz::plan`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    hccl_ir::fuzz::plan(data);
});
