mod decoder;
mod encoder;
pub(crate) mod header;
// PATCH (runtime-proxy, vendor/README.md): the Huffman decoder is public with `unstable`.
#[cfg(not(feature = "unstable"))]
pub(crate) mod huffman;
#[cfg(feature = "unstable")]
pub mod huffman;
mod table;

#[cfg(test)]
mod test;

pub use self::decoder::{Decoder, DecoderError, NeedMore};
pub use self::encoder::Encoder;
pub use self::header::{BytesStr, Header};
