//! Property test: no byte sequence from a socket makes a decoder panic.
//! Runs on stable in `make test` (proptest, not cargo-fuzz).

use proptest::prelude::*;
use sluice_wire::*;

proptest! {
    #![proptest_config(ProptestConfig { cases: 4000, ..ProptestConfig::default() })]

    #[test]
    fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        let _ = split_startup(&bytes);
        let _ = split_frame(&bytes, 1 << 20);
        let _ = Authentication::decode(&bytes);
        let _ = ErrorFields::decode(&bytes);
        let _ = ParameterStatus::decode(&bytes);
        let _ = BackendKeyData::decode(&bytes);
        let _ = TransactionStatus::decode(&bytes);
        let _ = PasswordMessage::decode_password(&bytes);
        let _ = PasswordMessage::decode_sasl_initial(&bytes);
        let _ = query_text(&bytes);
        let _ = CancelRequest::decode(&bytes);
    }

    #[test]
    fn framing_walks_any_stream(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        // Walk the buffer as the session loop does: header, length, next.
        let mut rest = &bytes[..];
        while let Ok(Some(h)) = split_frame(rest, 1 << 16) {
            prop_assert!(h.total_len >= HEADER_LEN);
            if h.total_len > rest.len() { break; }
            rest = &rest[h.total_len..];
        }
    }

    #[test]
    fn startup_with_any_params_round_trips(
        params in proptest::collection::vec(("[a-z_]{1,12}", "[ -~]{0,20}"), 0..8)
    ) {
        let mut buf = bytes::BytesMut::new();
        encode_startup(&mut buf, params.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        let (p, used) = split_startup(&buf).unwrap().unwrap();
        prop_assert_eq!(used, buf.len());
        let StartupPacket::Startup { params: got, .. } = p else { panic!("not startup") };
        prop_assert_eq!(got.0.len(), params.len());
    }
}
