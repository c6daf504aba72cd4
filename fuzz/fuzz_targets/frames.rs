#![no_main]
//! The network frame parser of a receiving rank, see `hccl_executor::fuzz::frames`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = hccl_executor::fuzz::frames(data);
});
