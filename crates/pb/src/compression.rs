//! The daemons' framework's compression formats (Flare's
//! `compression_algorithm`): 2 gzip (zlib with the gzip wrapper,
//! `MAX_WBITS + 16`), 3 lz4 frame (`LZ4F`), 4 snappy (the raw format: a
//! varint length, then the blocks; not the framed format) and 5 zstd (a
//! standard zstd frame). One codec for both ends: the scheduler inflates
//! requests and compresses answers with it (`rpc::compression`), the
//! simulated daemons inflate answers and compress requests
//! (`sim::wire::compression`).

use std::io::{self, Read, Write};

/// The largest zstd window (as a power of two) a request may ask the decoder
/// for: 8 MiB, what zstd's levels 1 to 19 use at most. A crafted frame could
/// otherwise make the decoder allocate its 128 MiB default for a request of
/// a few bytes.
const ZSTD_WINDOW_LOG_MAX: u32 = 23;

/// One of the framework's compression algorithms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    Gzip,
    Lz4Frame,
    Snappy,
    Zstd,
}

/// Why a compressed message could not be inflated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InflateError {
    /// It inflates beyond the limit (a bomb, or simply too large).
    #[error("the {algorithm} message inflates beyond the {limit}-byte limit")]
    TooLarge {
        algorithm: &'static str,
        limit: usize,
    },
    /// It is not a whole message of its algorithm.
    #[error("the {algorithm} message does not inflate: {reason}")]
    Corrupt {
        algorithm: &'static str,
        reason: String,
    },
}

impl Algorithm {
    /// Every algorithm, in the order answers prefer them: zstd compresses
    /// best at a speed close to lz4's, lz4 is the fastest, gzip every
    /// client has, snappy last (the weakest ratio).
    pub const PREFERRED: [Algorithm; 4] = [
        Algorithm::Zstd,
        Algorithm::Lz4Frame,
        Algorithm::Gzip,
        Algorithm::Snappy,
    ];

    /// Its number in the meta (`flare.rpc.CompressionAlgorithm`).
    pub fn wire(self) -> i32 {
        use crate::flare::rpc::CompressionAlgorithm as Wire;
        match self {
            Algorithm::Gzip => Wire::Gzip as i32,
            Algorithm::Lz4Frame => Wire::Lz4Frame as i32,
            Algorithm::Snappy => Wire::Snappy as i32,
            Algorithm::Zstd => Wire::Zstd as i32,
        }
    }

    /// What a meta's `compression_algorithm` says about its message: `None`
    /// uncompressed (absent, or 1), an algorithm, or `Err` with a value the
    /// framework defines no algorithm for (0 "unknown", or beyond 5).
    pub fn from_wire(value: Option<i32>) -> Result<Option<Algorithm>, i32> {
        use crate::flare::rpc::CompressionAlgorithm as Wire;
        let Some(value) = value else {
            return Ok(None);
        };
        match Wire::try_from(value) {
            Ok(Wire::None) => Ok(None),
            Ok(Wire::Gzip) => Ok(Some(Algorithm::Gzip)),
            Ok(Wire::Lz4Frame) => Ok(Some(Algorithm::Lz4Frame)),
            Ok(Wire::Snappy) => Ok(Some(Algorithm::Snappy)),
            Ok(Wire::Zstd) => Ok(Some(Algorithm::Zstd)),
            Ok(Wire::Unknown) | Err(_) => Err(value),
        }
    }

    /// Its name, as the framework registers it.
    pub fn label(self) -> &'static str {
        match self {
            Algorithm::Gzip => "gzip",
            Algorithm::Lz4Frame => "lz4-frame",
            Algorithm::Snappy => "snappy",
            Algorithm::Zstd => "zstd",
        }
    }

    /// `message` compressed the way the framework's decompressor reads it.
    pub fn compress(self, message: &[u8]) -> Vec<u8> {
        let compressed = match self {
            Algorithm::Gzip => {
                let mut encoder =
                    flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
                encoder.write_all(message).and_then(|()| encoder.finish())
            }
            Algorithm::Lz4Frame => {
                let mut encoder = lz4_flex::frame::FrameEncoder::new(Vec::new());
                encoder
                    .write_all(message)
                    .and_then(|()| encoder.finish().map_err(io::Error::other))
            }
            Algorithm::Snappy => snap::raw::Encoder::new()
                .compress_vec(message)
                .map_err(io::Error::other),
            // Level 0 is zstd's default (3): the list is compressed once per
            // version, and a higher level costs callers waiting for it more
            // than it saves on random task digests.
            Algorithm::Zstd => zstd::bulk::compress(message, 0),
        };
        // Writing into memory fails only when memory is exhausted, and snappy
        // only on inputs of 4 GiB and more, far beyond any answer.
        compressed.unwrap_or_else(|error| panic!("{} compression failed: {error}", self.label()))
    }

    /// Inflates `compressed`, refusing a message that is not a whole message
    /// of this algorithm or that inflates beyond `limit` bytes. Memory is
    /// bounded by the limit: nothing beyond it is ever inflated.
    pub fn inflate(self, compressed: &[u8], limit: usize) -> Result<Vec<u8>, InflateError> {
        let too_large = InflateError::TooLarge {
            algorithm: self.label(),
            limit,
        };
        let corrupt = |reason: String| InflateError::Corrupt {
            algorithm: self.label(),
            reason,
        };
        // One byte past the limit tells "exactly at it" from "beyond".
        let bound = limit as u64 + 1;
        let mut inflated = Vec::new();
        let read = match self {
            Algorithm::Snappy => {
                // The raw format states its inflated length first.
                let length = snap::raw::decompress_len(compressed)
                    .map_err(|error| corrupt(error.to_string()))?;
                if length > limit {
                    return Err(too_large);
                }
                return snap::raw::Decoder::new()
                    .decompress_vec(compressed)
                    .map_err(|error| corrupt(error.to_string()));
            }
            Algorithm::Gzip => flate2::read::GzDecoder::new(compressed)
                .take(bound)
                .read_to_end(&mut inflated),
            Algorithm::Lz4Frame => lz4_flex::frame::FrameDecoder::new(compressed)
                .take(bound)
                .read_to_end(&mut inflated),
            Algorithm::Zstd => {
                zstd::stream::read::Decoder::with_buffer(compressed).and_then(|mut decoder| {
                    decoder.window_log_max(ZSTD_WINDOW_LOG_MAX)?;
                    decoder.take(bound).read_to_end(&mut inflated)
                })
            }
        };
        read.map_err(|error| corrupt(error.to_string()))?;
        if inflated.len() > limit {
            return Err(too_large);
        }
        Ok(inflated)
    }
}
