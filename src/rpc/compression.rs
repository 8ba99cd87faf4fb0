//! The binary protocol's message compressions, as the daemons' framework
//! (Flare) does them (the formats: [`crate::pb::compression`]). A request
//! compressed with any of them is inflated, bounded; an answer is compressed when it is large and the
//! caller accepts an algorithm (`acceptable_compression_algorithms`, one bit
//! per algorithm number: stock daemons send 62, every one of them).
//!
//! [`compress_answer`] is the one compression step: (payload, accepted) ->
//! (algorithm, payload). The `GetRunningTasks` answer
//! ([`super::running_tasks`]) keeps its result per algorithm, so the list
//! is compressed once per version, not once per caller.

use bytes::Bytes;

/// Answers shorter than this go uncompressed: every daemon call's answer
/// but a large cluster's `GetRunningTasks` list is far smaller, and
/// compressing a few hundred bytes costs more than sending them.
pub const COMPRESS_FROM_BYTES: usize = 64 << 10;

pub use crate::pb::compression::{Algorithm, InflateError};

/// `acceptable_compression_algorithms` of a request: bit `n` set when the
/// caller inflates algorithm number `n`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Accepted(u64);

impl Accepted {
    /// A caller that inflates nothing (every protocol but the binary one).
    pub const NONE: Accepted = Accepted(0);
    /// A caller that inflates every algorithm the framework defines: what
    /// stock daemons send (62).
    pub const ALL: Accepted = Accepted(0b11_1110);

    pub fn from_bits(bits: u64) -> Accepted {
        Accepted(bits)
    }

    pub fn accepts(self, algorithm: Algorithm) -> bool {
        // Numbers 2..5: the shift cannot overflow.
        self.0 & (1 << algorithm.wire()) != 0
    }

    /// The algorithm an answer to this caller is compressed with, if any.
    pub fn preferred(self) -> Option<Algorithm> {
        Algorithm::PREFERRED
            .into_iter()
            .find(|&algorithm| self.accepts(algorithm))
    }
}

/// The compression step of an answer: a payload of at least
/// [`COMPRESS_FROM_BYTES`] is compressed with the caller's preferred
/// algorithm; a smaller one, one for a caller that accepts none, or one that
/// compression would not shrink goes as it is (algorithm `None`).
pub fn compress_answer(payload: Bytes, accepted: Accepted) -> (Option<Algorithm>, Bytes) {
    match choose(payload.len(), accepted) {
        Some(algorithm) => compress_with(payload, algorithm),
        None => (None, payload),
    }
}

/// The algorithm an answer of `len` bytes to a caller accepting `accepted`
/// is compressed with, if any.
pub fn choose(len: usize, accepted: Accepted) -> Option<Algorithm> {
    accepted.preferred().filter(|_| len >= COMPRESS_FROM_BYTES)
}

/// `payload` compressed with `algorithm`, or as it is (algorithm `None`)
/// when compression would not shrink it.
pub fn compress_with(payload: Bytes, algorithm: Algorithm) -> (Option<Algorithm>, Bytes) {
    let compressed = algorithm.compress(&payload);
    if compressed.len() >= payload.len() {
        return (None, payload);
    }
    (Some(algorithm), Bytes::from(compressed))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Something like a task list: repeated text with random-looking digests.
    fn message(len: usize) -> Vec<u8> {
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        let mut out = Vec::with_capacity(len);
        while out.len() < len {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            out.extend_from_slice(b"\x0a\x50\x12\x0e10.0.0.7:8335\x1a\x40");
            out.extend_from_slice(format!("{state:016x}{:016x}", state.rotate_left(7)).as_bytes());
        }
        out.truncate(len);
        out
    }

    #[test]
    fn every_algorithm_inflates_what_it_compressed_and_nothing_beyond_the_limit() {
        let original = message(200_000);
        for algorithm in Algorithm::PREFERRED {
            let compressed = algorithm.compress(&original);
            assert!(compressed.len() < original.len(), "{algorithm:?}");
            assert_eq!(
                algorithm.inflate(&compressed, original.len()).as_ref(),
                Ok(&original),
                "{algorithm:?}"
            );
            assert_eq!(
                algorithm.inflate(&compressed, original.len() - 1),
                Err(InflateError::TooLarge {
                    algorithm: algorithm.label(),
                    limit: original.len() - 1
                }),
                "{algorithm:?}: one byte over the limit is refused, not cut"
            );
        }
    }

    #[test]
    fn a_bomb_is_refused_at_the_limit() {
        // 16 MiB of zeros compress to a few KiB (gzip: 16 KiB).
        let zeros = vec![0u8; 16 << 20];
        for algorithm in Algorithm::PREFERRED {
            let bomb = algorithm.compress(&zeros);
            assert!(bomb.len() < 4 << 20, "{algorithm:?}: {}", bomb.len());
            assert!(
                matches!(
                    algorithm.inflate(&bomb, 4 << 20),
                    Err(InflateError::TooLarge { .. })
                ),
                "{algorithm:?}"
            );
        }
    }

    #[test]
    fn damaged_or_foreign_input_is_corrupt() {
        let original = message(10_000);
        for algorithm in Algorithm::PREFERRED {
            let mut compressed = algorithm.compress(&original);
            compressed.truncate(compressed.len() / 2);
            assert!(
                matches!(
                    algorithm.inflate(&compressed, 1 << 20),
                    Err(InflateError::Corrupt { .. })
                ),
                "{algorithm:?}: truncated"
            );
            assert!(
                matches!(
                    algorithm.inflate(b"plain protobuf, not compressed", 1 << 20),
                    Err(InflateError::Corrupt { .. })
                ),
                "{algorithm:?}: not compressed"
            );
        }
    }

    #[test]
    fn the_formats_are_the_framework_s() {
        let original = message(1000);
        // gzip: the gzip wrapper (magic 1f 8b), not bare zlib or deflate.
        assert_eq!(Algorithm::Gzip.compress(&original)[..2], [0x1f, 0x8b]);
        // lz4: the frame format's magic 0x184D2204, little-endian.
        assert_eq!(
            Algorithm::Lz4Frame.compress(&original)[..4],
            [0x04, 0x22, 0x4d, 0x18]
        );
        // zstd: a standard frame, magic 0xFD2FB528.
        assert_eq!(
            Algorithm::Zstd.compress(&original)[..4],
            [0x28, 0xb5, 0x2f, 0xfd]
        );
        // snappy: raw, starting with the varint length (1000 = e8 07), not
        // the framed format's stream identifier (ff 06 00 00 sNaPpY).
        assert_eq!(Algorithm::Snappy.compress(&original)[..2], [0xe8, 0x07]);
    }

    #[test]
    fn meta_values_and_accepted_bits_are_the_framework_s() {
        assert_eq!(Algorithm::from_wire(None), Ok(None));
        assert_eq!(Algorithm::from_wire(Some(1)), Ok(None));
        assert_eq!(Algorithm::from_wire(Some(0)), Err(0));
        assert_eq!(Algorithm::from_wire(Some(6)), Err(6));
        assert_eq!(Algorithm::from_wire(Some(-1)), Err(-1));
        for algorithm in Algorithm::PREFERRED {
            assert_eq!(
                Algorithm::from_wire(Some(algorithm.wire())),
                Ok(Some(algorithm))
            );
        }
        // Stock daemons send 62: none, gzip, lz4, snappy and zstd.
        let daemon = Accepted::from_bits(62);
        assert_eq!(daemon, Accepted::ALL);
        assert!(Algorithm::PREFERRED.iter().all(|&a| daemon.accepts(a)));
        assert_eq!(daemon.preferred(), Some(Algorithm::Zstd));
        assert_eq!(Accepted::from_bits(1 << 1).preferred(), None);
        assert_eq!(
            Accepted::from_bits(1 << 2 | 1 << 3).preferred(),
            Some(Algorithm::Lz4Frame)
        );
        assert_eq!(
            Accepted::from_bits(1 << 2 | 1 << 4).preferred(),
            Some(Algorithm::Gzip)
        );
        assert_eq!(
            Accepted::from_bits(1 << 4).preferred(),
            Some(Algorithm::Snappy)
        );
        assert_eq!(Accepted::NONE.preferred(), None);
    }

    #[test]
    fn only_large_answers_for_accepting_callers_are_compressed() {
        let daemon = Accepted::from_bits(62);
        let small = Bytes::from(message(COMPRESS_FROM_BYTES - 1));
        let (algorithm, payload) = compress_answer(small.clone(), daemon);
        assert_eq!((algorithm, payload.as_ptr()), (None, small.as_ptr()));

        let large = Bytes::from(message(COMPRESS_FROM_BYTES));
        let (algorithm, payload) = compress_answer(large.clone(), daemon);
        assert_eq!(algorithm, Some(Algorithm::Zstd));
        assert!(payload.len() < large.len() / 2, "{}", payload.len());
        assert_eq!(
            Algorithm::Zstd.inflate(&payload, large.len()).unwrap(),
            large
        );

        let (algorithm, _) = compress_answer(large.clone(), Accepted::NONE);
        assert_eq!(algorithm, None);

        // Incompressible bytes go as they are.
        let mut state = 1u64;
        let noise: Vec<u8> = (0..COMPRESS_FROM_BYTES * 2)
            .map(|_| {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1);
                (state >> 56) as u8
            })
            .collect();
        let noise = Bytes::from(noise);
        let (algorithm, payload) = compress_answer(noise.clone(), daemon);
        assert_eq!((algorithm, payload.as_ptr()), (None, noise.as_ptr()));
    }
}
