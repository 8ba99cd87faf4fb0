//! The framework's message compressions (`flare.rpc.CompressionAlgorithm`):
//! gzip (zlib with the gzip wrapper), lz4 frame, raw snappy and zstd. A stock
//! daemon announces all of them in `acceptable_compression_algorithms` (62)
//! and inflates an answer whose meta names one; the simulator does the same,
//! and the tests compress requests with [`Compression::compress`].

use bytes::Bytes;

use yadcc_pb::{compression::Algorithm, flare::rpc::CompressionAlgorithm};

/// How a message travels: as it is, or compressed with one algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Compression {
    None,
    Gzip,
    Lz4Frame,
    Snappy,
    Zstd,
}

/// `acceptable_compression_algorithms` naming only uncompressed messages.
pub const ACCEPT_UNCOMPRESSED: u64 = 1 << CompressionAlgorithm::None as u64;

impl Compression {
    pub const ALL: [Compression; 5] = [
        Compression::None,
        Compression::Gzip,
        Compression::Lz4Frame,
        Compression::Snappy,
        Compression::Zstd,
    ];

    /// The meta's `compression_algorithm`: absent means none; 0 and unknown
    /// values are no algorithm a daemon can inflate.
    pub fn from_meta(algorithm: Option<i32>) -> Option<Compression> {
        let Some(algorithm) = algorithm else {
            return Some(Compression::None);
        };
        Some(match CompressionAlgorithm::try_from(algorithm).ok()? {
            CompressionAlgorithm::Unknown => return None,
            CompressionAlgorithm::None => Compression::None,
            CompressionAlgorithm::Gzip => Compression::Gzip,
            CompressionAlgorithm::Lz4Frame => Compression::Lz4Frame,
            CompressionAlgorithm::Snappy => Compression::Snappy,
            CompressionAlgorithm::Zstd => Compression::Zstd,
        })
    }

    /// The meta's value for this algorithm.
    pub fn algorithm(self) -> CompressionAlgorithm {
        match self {
            Compression::None => CompressionAlgorithm::None,
            Compression::Gzip => CompressionAlgorithm::Gzip,
            Compression::Lz4Frame => CompressionAlgorithm::Lz4Frame,
            Compression::Snappy => CompressionAlgorithm::Snappy,
            Compression::Zstd => CompressionAlgorithm::Zstd,
        }
    }

    /// Its bit in `acceptable_compression_algorithms`.
    pub fn bit(self) -> u64 {
        1 << self.algorithm() as u64
    }

    pub fn label(self) -> &'static str {
        match self {
            Compression::None => "none",
            Compression::Gzip => "gzip",
            Compression::Lz4Frame => "lz4",
            Compression::Snappy => "snappy",
            Compression::Zstd => "zstd",
        }
    }

    /// The framework's codec for it; none for an uncompressed message.
    fn codec(self) -> Option<Algorithm> {
        match self {
            Compression::None => None,
            Compression::Gzip => Some(Algorithm::Gzip),
            Compression::Lz4Frame => Some(Algorithm::Lz4Frame),
            Compression::Snappy => Some(Algorithm::Snappy),
            Compression::Zstd => Some(Algorithm::Zstd),
        }
    }

    /// `message` compressed as the framework does (for tests and fake servers).
    pub fn compress(self, message: &[u8]) -> Vec<u8> {
        match self.codec() {
            Some(algorithm) => algorithm.compress(message),
            None => message.to_vec(),
        }
    }

    /// A message that came with this compression, inflated as a daemon does
    /// (at most its 512 MiB packet limit); as it is if uncompressed.
    pub fn inflate_message(self, message: &Bytes) -> Result<Bytes, String> {
        if self == Compression::None {
            return Ok(message.clone());
        }
        self.inflate(message, super::FLARE_MAX_FRAME_BYTES)
            .map(Bytes::from)
    }

    /// Inflates `compressed`; an error if it is not a whole message of this
    /// algorithm or inflates beyond `limit` bytes.
    pub fn inflate(self, compressed: &[u8], limit: usize) -> Result<Vec<u8>, String> {
        match self.codec() {
            Some(algorithm) => algorithm
                .inflate(compressed, limit)
                .map_err(|error| error.to_string()),
            None if compressed.len() > limit => Err(format!("inflates beyond {limit} bytes")),
            None => Ok(compressed.to_vec()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_algorithm_inflates_what_it_compressed() {
        let message: Vec<u8> = (0..50_000u32)
            .flat_map(|n| (n % 251).to_le_bytes())
            .collect();
        for compression in Compression::ALL {
            let compressed = compression.compress(&message);
            if compression != Compression::None {
                assert!(compressed.len() < message.len() / 2, "{compression:?}");
            }
            let inflated = compression.inflate(&compressed, message.len()).unwrap();
            assert_eq!(inflated, message, "{compression:?}");
            // One byte short of the message: refused, not cut.
            let refused = compression.inflate(&compressed, message.len() - 1);
            assert!(refused.unwrap_err().contains("beyond"), "{compression:?}");
        }
    }

    #[test]
    fn damaged_input_is_an_error() {
        let message = b"the daemons inflate what the meta names".repeat(40);
        for compression in &Compression::ALL[1..] {
            let mut compressed = compression.compress(&message);
            let cut = compressed.len() / 2;
            compressed.truncate(cut);
            assert!(
                compression.inflate(&compressed, 1 << 20).is_err(),
                "{compression:?}"
            );
        }
    }

    #[test]
    fn meta_values_and_bits_are_the_framework_s() {
        let accepted: u64 = Compression::ALL.iter().map(|c| c.bit()).sum();
        assert_eq!(accepted, 62, "what stock daemons send");
        assert_eq!(ACCEPT_UNCOMPRESSED, Compression::None.bit());
        assert_eq!(Compression::from_meta(None), Some(Compression::None));
        assert_eq!(Compression::from_meta(Some(5)), Some(Compression::Zstd));
        assert_eq!(Compression::from_meta(Some(0)), None);
        assert_eq!(Compression::from_meta(Some(9)), None);
        for compression in Compression::ALL {
            let value = compression.algorithm() as i32;
            assert_eq!(Compression::from_meta(Some(value)), Some(compression));
        }
    }
}
