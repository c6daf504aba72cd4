//! Entry points for the fuzz targets in `fuzz/` (cargo fuzz) and for the tests that replay
//! their corpus: the network frame parser and the rendezvous messages, which are private to
//! the crate otherwise. Not part of the API.

/// Parses `input` as the byte stream a peer on another host sends (the first byte chooses
/// how it is read), checking the receiver's invariants: nothing outside the credit window
/// is published, nothing lands outside the slots of the connections the peer sends on, and
/// the parser never stalls. Malformed input ends the stream with an error (returned), never
/// a panic; `Ok` when the stream ended with a goodbye.
pub fn frames(input: &[u8]) -> Result<(), String> {
    crate::backends::net::fuzz::fuzz_frames(input)
}

/// Parses `input` as a rendezvous message (the first byte says which: a rank's hello, rank
/// 0's answer or a data connection's hello); what reads must read the same once written
/// again.
pub fn rendezvous(input: &[u8]) {
    crate::backends::process::rendezvous::fuzz_rendezvous(input);
}

/// Well-formed inputs of [`frames`], made by the encoder: seeds for the fuzzer.
pub fn frame_seeds() -> Vec<Vec<u8>> {
    crate::backends::net::fuzz::frame_seeds()
}

/// Well-formed inputs of [`rendezvous`], made by the encoders: seeds for the fuzzer.
pub fn rendezvous_seeds() -> Vec<Vec<u8>> {
    crate::backends::process::rendezvous::rendezvous_seeds()
}
