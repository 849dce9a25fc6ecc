//! The relay's HPACK decoder (`runtime_proxy::http2::hpack`) against h2's, block after block on one
//! connection's table: neither may panic, and every block h2 decodes must decode to the same
//! fields (names and values as bytes, in order). h2 is stricter (it validates header names and
//! values), so the comparison ends at the first block h2 refuses: from there on the two tables
//! may differ.
#![no_main]

use std::io::Cursor;
use std::ops::ControlFlow;

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use runtime_proxy::http2::hpack::{Decoder, Fields};

fuzz_target!(|blocks: Vec<Vec<u8>>| {
    let (mut ours, mut theirs) = (Decoder::default(), h2::hpack::Decoder::new(4096));
    let mut fields = Fields::default();
    for block in blocks {
        let decoded = ours.decode(&block, &mut fields, 4096, 1 << 20);
        let mut want = Vec::new();
        let mut buf = BytesMut::from(&block[..]);
        let h2_ok = theirs
            .decode(&mut Cursor::new(&mut buf), |h| {
                want.push((h.name().as_slice().to_vec(), h.value_slice().to_vec()));
                ControlFlow::Continue(())
            })
            .is_ok();
        if !h2_ok {
            return;
        }
        assert_eq!(decoded, Ok(()), "h2 decoded {block:02x?} to {want:?}");
        let got: Vec<(Vec<u8>, Vec<u8>)> = fields.iter().map(|(n, v)| (n.to_vec(), v.to_vec())).collect();
        assert_eq!(got, want, "block {block:02x?}");
    }
});
