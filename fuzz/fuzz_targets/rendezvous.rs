#![no_main]
//! The rendezvous messages (a rank's hello, rank 0's answer, a data connection's hello),
//! see `hccl_executor::fuzz::rendezvous`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    hccl_executor::fuzz::rendezvous(data);
});
