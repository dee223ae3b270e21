//! The servers' codec: prost, except that a request which cannot be decoded, or which is
//! larger than `MAX_REQUEST_BYTES`, is answered as a `request` refusal (nothing ran).
//!
//! Only servers use it (see build.rs). A client decoding an answer must never mark a
//! decode failure as not dispatched: the code may have run.

use std::marker::PhantomData;

use prost::Message;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic::Status;
use tonic_prost::{ProstCodec, ProstEncoder};

use crate::validate::MAX_REQUEST_BYTES;
use crate::Refusal;

/// Prost encoding; decode failures become marked `request` refusals.
#[derive(Debug, Clone)]
pub struct MarkedCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for MarkedCodec<T, U> {
    fn default() -> Self {
        MarkedCodec(PhantomData)
    }
}

/// Decoder half of [`MarkedCodec`].
#[derive(Debug, Clone)]
pub struct MarkedDecoder<U>(PhantomData<U>);

impl<U: Message + Default> Decoder for MarkedDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        use bytes_len::Remaining;
        decode_request(buf.remaining_len(), buf)
            .map(Some)
            .map_err(|r| r.to_status())
    }

    fn buffer_settings(&self) -> BufferSettings {
        BufferSettings::default()
    }
}

mod bytes_len {
    /// `Buf::remaining` without naming the `bytes` crate.
    pub trait Remaining {
        fn remaining_len(&self) -> usize;
    }
    impl Remaining for tonic::codec::DecodeBuf<'_> {
        fn remaining_len(&self) -> usize {
            prost::bytes::Buf::remaining(self)
        }
    }
}

/// Decodes one request message of `len` bytes, refusing oversize and malformed input.
/// Public so fuzz targets and tests can feed it arbitrary bytes.
pub fn decode_request<U: Message + Default>(
    len: usize,
    buf: impl prost::bytes::Buf,
) -> Result<U, Refusal> {
    if len > MAX_REQUEST_BYTES {
        return Err(Refusal::request(format!(
            "the request is {len} bytes; at most {MAX_REQUEST_BYTES} are accepted"
        )));
    }
    U::decode(buf).map_err(|e| Refusal::request(format!("the request could not be decoded: {e}")))
}

impl<T, U> Codec for MarkedCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = MarkedDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<T, U>::raw_encoder(BufferSettings::default())
    }

    fn decoder(&mut self) -> Self::Decoder {
        MarkedDecoder(PhantomData)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{pb, Reason};

    #[test]
    fn garbage_is_a_request_refusal() {
        let r = decode_request::<pb::RunRequest>(3, &[0xff, 0xff, 0xff][..]).unwrap_err();
        assert_eq!(r.reason, Reason::Request);
        let big = decode_request::<pb::RunRequest>(MAX_REQUEST_BYTES + 1, &[][..]).unwrap_err();
        assert!(big.message.contains("bytes"), "{}", big.message);
    }

    #[test]
    fn valid_bytes_decode() {
        let req = pb::RunRequest {
            protocol: 5,
            ..Default::default()
        };
        let bytes = req.encode_to_vec();
        assert_eq!(
            decode_request::<pb::RunRequest>(bytes.len(), &bytes[..]).unwrap(),
            req
        );
    }
}
