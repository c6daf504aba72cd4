#![no_main]
//! The topology parser (RON → spec → validated graph), see `hccl_topologies::fuzz`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    hccl_topologies::fuzz::topology(data);
});
