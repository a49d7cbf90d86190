//! The NRI socket multiplexer.
//!
//! NRI carries several logical connections over one unix socket. Each frame is an 8-byte header
//! (connection id `u32` big-endian, payload length `u32` big-endian) followed by the payload.
//! Connection 1 carries the Plugin service (the runtime calls us), connection 2 the Runtime
//! service (we call the runtime). There are no open/close frames; frames for an unknown
//! connection are dropped.
//!
//! Inbound, the Go side may send frames of up to `10 + 4 MiB` bytes, and a ttrpc message may be
//! spread over several frames, so each logical connection is a byte stream that we reassemble.
//! Outbound, the Go mux hands exactly one frame to each `Read` call and fails with `ENOMEM` when
//! the caller's buffer is smaller than the frame; Go ttrpc reads through a 4096-byte
//! `bufio.Reader`, so we never send a payload larger than [`MAX_OUT_PAYLOAD`].

use std::collections::HashMap;
use std::io;

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream};
use tokio::sync::{mpsc, watch};

/// Connection id of the Plugin service (runtime → plugin requests; we are the ttrpc server).
pub const PLUGIN_SERVICE_CONN: u32 = 1;
/// Connection id of the Runtime service (plugin → runtime requests; we are the ttrpc client).
pub const RUNTIME_SERVICE_CONN: u32 = 2;
/// Frame header length: connection id + payload length.
pub const HEADER_LEN: usize = 8;
/// Largest payload we send in one frame (what Go ttrpc's bufio reader takes in one read).
pub const MAX_OUT_PAYLOAD: usize = 4096;
/// Largest payload we accept in one frame: a ttrpc header plus its 4 MiB message limit,
/// the same bound the Go mux enforces.
pub const MAX_IN_PAYLOAD: usize = 10 + (4 << 20);

/// Errors of the frame layer.
#[derive(Debug, thiserror::Error)]
pub enum MuxError {
    #[error("connection id 0 is reserved")]
    ReservedConnId,
    #[error("frame for connection {conn} has payload {len} bytes, maximum is {max}")]
    FrameTooLarge { conn: u32, len: usize, max: usize },
}

impl From<MuxError> for io::Error {
    fn from(e: MuxError) -> Self {
        io::Error::new(io::ErrorKind::InvalidData, e)
    }
}

/// Appends `data` for connection `conn` to `out` as frames of at most `max_payload` bytes.
pub fn encode_frames(conn: u32, data: &[u8], max_payload: usize, out: &mut Vec<u8>) {
    assert!(max_payload > 0, "max_payload must be positive");
    for chunk in data.chunks(max_payload) {
        out.extend_from_slice(&conn.to_be_bytes());
        out.extend_from_slice(&(chunk.len() as u32).to_be_bytes());
        out.extend_from_slice(chunk);
    }
}

/// Incremental frame decoder: feed it bytes as they arrive, take complete frames out.
#[derive(Debug, Default)]
pub struct FrameDecoder {
    buf: BytesMut,
}

impl FrameDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds bytes read from the trunk.
    pub fn push(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// Returns the next complete frame, `Ok(None)` when more bytes are needed.
    pub fn next_frame(&mut self) -> Result<Option<(u32, BytesMut)>, MuxError> {
        if self.buf.len() < HEADER_LEN {
            return Ok(None);
        }
        let conn = u32::from_be_bytes(self.buf[0..4].try_into().expect("4 bytes"));
        let len = u32::from_be_bytes(self.buf[4..8].try_into().expect("4 bytes")) as usize;
        if len > MAX_IN_PAYLOAD {
            return Err(MuxError::FrameTooLarge {
                conn,
                len,
                max: MAX_IN_PAYLOAD,
            });
        }
        if conn == 0 {
            return Err(MuxError::ReservedConnId);
        }
        if self.buf.len() < HEADER_LEN + len {
            self.buf.reserve(HEADER_LEN + len - self.buf.len());
            return Ok(None);
        }
        self.buf.advance(HEADER_LEN);
        Ok(Some((conn, self.buf.split_to(len))))
    }

    /// Bytes buffered but not yet returned as a frame.
    pub fn pending(&self) -> usize {
        self.buf.len()
    }
}

/// A running multiplexer over one trunk socket.
pub struct Mux {
    conns: HashMap<u32, DuplexStream>,
    closed: watch::Receiver<Option<String>>,
}

/// Size of the in-memory pipe behind each logical connection.
const PIPE_CAPACITY: usize = 1 << 20;

impl Mux {
    /// Starts reader and writer tasks for `trunk`, exposing logical connections `ids` as
    /// in-memory byte streams. Must be called inside a tokio runtime.
    pub fn start<T>(trunk: T, ids: &[u32]) -> Self
    where
        T: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (trunk_r, trunk_w) = tokio::io::split(trunk);
        let (closed_tx, closed_rx) = watch::channel(None::<String>);
        let (frame_tx, frame_rx) = mpsc::channel::<Vec<u8>>(256);
        let mut conns = HashMap::new();
        let mut inbound = HashMap::new();
        for &id in ids {
            assert!(id != 0, "connection id 0 is reserved");
            let (ours, theirs) = tokio::io::duplex(PIPE_CAPACITY);
            let (ours_r, ours_w) = tokio::io::split(ours);
            inbound.insert(id, ours_w);
            conns.insert(id, theirs);
            tokio::spawn(pump_outbound(id, ours_r, frame_tx.clone()));
        }
        drop(frame_tx);
        let closed_w = closed_tx.clone();
        tokio::spawn(async move {
            let result = write_trunk(trunk_w, frame_rx).await;
            let reason = match result {
                Ok(()) => "all connections closed".to_string(),
                Err(e) => format!("write to runtime socket failed: {e}"),
            };
            closed_w.send_if_modified(|v| set_once(v, reason));
        });
        tokio::spawn(async move {
            let reason = match read_trunk(trunk_r, inbound).await {
                Ok(()) => "runtime closed the connection".to_string(),
                Err(e) => format!("read from runtime socket failed: {e}"),
            };
            closed_tx.send_if_modified(|v| set_once(v, reason));
        });
        Mux {
            conns,
            closed: closed_rx,
        }
    }

    /// Takes the byte stream of logical connection `id` (once).
    pub fn take(&mut self, id: u32) -> Option<DuplexStream> {
        self.conns.remove(&id)
    }

    /// A handle that resolves when the trunk is gone, with the reason.
    pub fn closed(&self) -> MuxClosed {
        MuxClosed(self.closed.clone())
    }
}

fn set_once(slot: &mut Option<String>, reason: String) -> bool {
    if slot.is_none() {
        *slot = Some(reason);
        true
    } else {
        false
    }
}

/// Resolves when the multiplexer's trunk has closed.
#[derive(Clone)]
pub struct MuxClosed(watch::Receiver<Option<String>>);

impl MuxClosed {
    pub async fn wait(mut self) -> String {
        loop {
            if let Some(reason) = self.0.borrow().clone() {
                return reason;
            }
            if self.0.changed().await.is_err() {
                return "multiplexer stopped".to_string();
            }
        }
    }
}

async fn pump_outbound<R: AsyncRead + Unpin>(id: u32, mut src: R, tx: mpsc::Sender<Vec<u8>>) {
    let mut buf = vec![0u8; MAX_OUT_PAYLOAD];
    loop {
        let n = match src.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let mut frame = Vec::with_capacity(HEADER_LEN + n);
        encode_frames(id, &buf[..n], MAX_OUT_PAYLOAD, &mut frame);
        if tx.send(frame).await.is_err() {
            return;
        }
    }
}

async fn write_trunk<W: AsyncWrite + Unpin>(
    mut w: W,
    mut rx: mpsc::Receiver<Vec<u8>>,
) -> io::Result<()> {
    while let Some(frame) = rx.recv().await {
        w.write_all(&frame).await?;
        w.flush().await?;
    }
    // Every logical connection is closed on our side: tell the peer (half-close), so that
    // it closes too and our reader sees the end.
    w.shutdown().await
}

async fn read_trunk<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
    mut r: R,
    mut conns: HashMap<u32, W>,
) -> io::Result<()> {
    let mut dec = FrameDecoder::new();
    let mut buf = vec![0u8; 64 * 1024];
    let result = loop {
        let n = match r.read(&mut buf).await {
            Ok(0) => break Ok(()),
            Ok(n) => n,
            Err(e) => break Err(e),
        };
        dec.push(&buf[..n]);
        let mut failed = None;
        loop {
            match dec.next_frame() {
                Ok(Some((id, payload))) => {
                    if let Some(w) = conns.get_mut(&id)
                        && let Err(e) = w.write_all(&payload).await
                    {
                        tracing::debug!(conn = id, error = %e, "logical connection closed");
                        conns.remove(&id);
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        if let Some(e) = failed {
            break Err(e.into());
        }
    };
    for (_, mut w) in conns {
        let _ = w.shutdown().await;
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn decode_all(dec: &mut FrameDecoder) -> Vec<(u32, Vec<u8>)> {
        let mut out = vec![];
        while let Some((id, p)) = dec.next_frame().unwrap() {
            out.push((id, p.to_vec()));
        }
        out
    }

    #[test]
    fn encodes_header_big_endian() {
        let mut out = vec![];
        encode_frames(2, b"abc", 4096, &mut out);
        assert_eq!(out, [0, 0, 0, 2, 0, 0, 0, 3, b'a', b'b', b'c']);
    }

    #[test]
    fn large_message_is_split_at_4096() {
        let data = vec![7u8; 10_000];
        let mut out = vec![];
        encode_frames(1, &data, MAX_OUT_PAYLOAD, &mut out);
        let mut dec = FrameDecoder::new();
        dec.push(&out);
        let frames = decode_all(&mut dec);
        let sizes: Vec<usize> = frames.iter().map(|(_, p)| p.len()).collect();
        assert_eq!(sizes, vec![4096, 4096, 1808]);
        assert!(frames.iter().all(|(id, _)| *id == 1));
    }

    #[test]
    fn accepts_largest_inbound_frame_and_rejects_larger() {
        let mut dec = FrameDecoder::new();
        let mut hdr = vec![];
        hdr.extend_from_slice(&1u32.to_be_bytes());
        hdr.extend_from_slice(&(MAX_IN_PAYLOAD as u32).to_be_bytes());
        dec.push(&hdr);
        dec.push(&vec![1u8; MAX_IN_PAYLOAD]);
        let (id, p) = dec.next_frame().unwrap().unwrap();
        assert_eq!((id, p.len()), (1, MAX_IN_PAYLOAD));

        let mut dec = FrameDecoder::new();
        let mut hdr = vec![];
        hdr.extend_from_slice(&1u32.to_be_bytes());
        hdr.extend_from_slice(&(MAX_IN_PAYLOAD as u32 + 1).to_be_bytes());
        dec.push(&hdr);
        let err = dec.next_frame().unwrap_err();
        assert!(err.to_string().contains("maximum is 4194314"), "{err}");
    }

    #[test]
    fn rejects_connection_zero() {
        let mut dec = FrameDecoder::new();
        dec.push(&[0, 0, 0, 0, 0, 0, 0, 1, 9]);
        assert!(matches!(dec.next_frame(), Err(MuxError::ReservedConnId)));
    }

    proptest! {
        /// Any sequence of messages, encoded and delivered in arbitrary splits (including
        /// several frames merged into one read), decodes to the same per-connection streams.
        #[test]
        fn split_and_merged_reads_roundtrip(
            msgs in proptest::collection::vec((1u32..4, proptest::collection::vec(any::<u8>(), 0..9000)), 0..12),
            cuts in proptest::collection::vec(1usize..5000, 0..40),
        ) {
            let mut wire = vec![];
            for (id, data) in &msgs {
                encode_frames(*id, data, MAX_OUT_PAYLOAD, &mut wire);
            }
            let mut dec = FrameDecoder::new();
            let mut got: HashMap<u32, Vec<u8>> = HashMap::new();
            let mut pos = 0;
            let mut cut_iter = cuts.iter().cycle();
            while pos < wire.len() {
                let step = if cuts.is_empty() { wire.len() } else { *cut_iter.next().unwrap() };
                let end = (pos + step).min(wire.len());
                dec.push(&wire[pos..end]);
                pos = end;
                for (id, p) in decode_all(&mut dec) {
                    prop_assert!(p.len() <= MAX_OUT_PAYLOAD);
                    got.entry(id).or_default().extend_from_slice(&p);
                }
            }
            prop_assert_eq!(dec.pending(), 0);
            let mut want: HashMap<u32, Vec<u8>> = HashMap::new();
            for (id, data) in &msgs {
                want.entry(*id).or_default().extend_from_slice(data);
            }
            want.retain(|_, v| !v.is_empty());
            got.retain(|_, v| !v.is_empty());
            prop_assert_eq!(got, want);
        }
    }

    #[tokio::test]
    async fn mux_routes_streams_both_ways_and_reports_close() {
        let (plugin_side, mut runtime_side) = tokio::io::duplex(1 << 16);
        let mut mux = Mux::start(plugin_side, &[PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN]);
        let mut c1 = mux.take(PLUGIN_SERVICE_CONN).unwrap();
        let mut c2 = mux.take(RUNTIME_SERVICE_CONN).unwrap();
        let closed = mux.closed();

        // Inbound: one 9000-byte frame for conn 1, a frame for an unknown conn, and a
        // frame for conn 2, all in one write.
        let mut wire = vec![];
        encode_frames(1, &vec![5u8; 9000], 9000, &mut wire);
        encode_frames(9, b"dropped", 4096, &mut wire);
        encode_frames(2, b"hello", 4096, &mut wire);
        runtime_side.write_all(&wire).await.unwrap();
        let mut got = vec![0u8; 9000];
        c1.read_exact(&mut got).await.unwrap();
        assert!(got.iter().all(|b| *b == 5));
        let mut got = [0u8; 5];
        c2.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"hello");

        // Outbound: a 10000-byte write arrives as frames of at most 4096 bytes.
        c2.write_all(&vec![3u8; 10_000]).await.unwrap();
        let mut dec = FrameDecoder::new();
        let mut total = 0;
        while total < 10_000 {
            let mut buf = [0u8; 8192];
            let n = runtime_side.read(&mut buf).await.unwrap();
            dec.push(&buf[..n]);
            while let Some((id, p)) = dec.next_frame().unwrap() {
                assert_eq!(id, 2);
                assert!(p.len() <= MAX_OUT_PAYLOAD);
                total += p.len();
            }
        }
        assert_eq!(total, 10_000);

        drop(runtime_side);
        let reason = tokio::time::timeout(std::time::Duration::from_secs(5), closed.wait())
            .await
            .unwrap();
        assert!(reason.contains("closed"), "{reason}");
        let mut rest = vec![];
        c1.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty());
    }
}
