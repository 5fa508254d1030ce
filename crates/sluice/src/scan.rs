//! Walks a byte stream message by message across reads, reading five header
//! bytes per message and a body only where policy needs it. Bytes of
//! messages whose body does not matter are passed on as soon as they arrive,
//! even when the message is not complete, so large rows and COPY data stream
//! through without being buffered whole.

use sluice_wire::{WireError, split_frame};

/// What to do with a visited message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Visit {
    /// Pass it on.
    Forward,
    /// Stop before it: it and what follows stay in the buffer.
    StopBefore,
}

/// Where a scan ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScanEnd {
    /// Bytes before this offset may be forwarded.
    pub forward_to: usize,
    /// The visitor asked to stop.
    pub stopped: bool,
}

/// Position in a message stream that persists between reads.
#[derive(Debug, Default)]
pub struct Scanner {
    /// Bytes of a passed-through message that have not arrived yet.
    pending: usize,
    /// After the last scan: where in the buffer a message ends that must
    /// be complete before it is visited and is not yet (0 when none). The
    /// buffer must be allowed to hold that much.
    wanted: usize,
}

impl Scanner {
    /// True between messages: nothing of a message is half forwarded.
    pub fn at_boundary(&self) -> bool {
        self.pending == 0
    }

    /// Bytes of a message passed on as they come that have not arrived.
    pub fn pending(&self) -> usize {
        self.pending
    }

    /// Buffer length at which the incomplete whole message the last scan
    /// stopped at is complete (0: none).
    pub fn wanted(&self) -> usize {
        self.wanted
    }

    /// The buffer's first `n` bytes were taken out after the last scan:
    /// `wanted` counts from the new start.
    pub fn consumed(&mut self, n: usize) {
        self.wanted = self.wanted.saturating_sub(n);
    }

    /// Scans `buf[start..]`. `needs_body(tag)` says which messages must be
    /// complete before they are visited (and get their body); others are
    /// visited with an empty body as soon as their header is there.
    pub fn scan(
        &mut self,
        buf: &[u8],
        start: usize,
        limit: usize,
        needs_body: impl Fn(u8) -> bool,
        mut visit: impl FnMut(u8, &[u8]) -> Visit,
    ) -> Result<ScanEnd, WireError> {
        let mut pos = start;
        self.wanted = 0;
        if self.pending > 0 {
            let n = self.pending.min(buf.len() - pos);
            pos += n;
            self.pending -= n;
            if self.pending > 0 {
                return Ok(ScanEnd {
                    forward_to: pos,
                    stopped: false,
                });
            }
        }
        while let Some(h) = split_frame(&buf[pos..], limit)? {
            let end = pos + h.total_len;
            let whole = end <= buf.len();
            if needs_body(h.tag) {
                if !whole {
                    self.wanted = end;
                    break;
                }
                if visit(h.tag, &buf[pos + sluice_wire::HEADER_LEN..end]) == Visit::StopBefore {
                    return Ok(ScanEnd {
                        forward_to: pos,
                        stopped: true,
                    });
                }
                pos = end;
            } else {
                if visit(h.tag, &[]) == Visit::StopBefore {
                    return Ok(ScanEnd {
                        forward_to: pos,
                        stopped: true,
                    });
                }
                if whole {
                    pos = end;
                } else {
                    self.pending = end - buf.len();
                    pos = buf.len();
                    break;
                }
            }
        }
        Ok(ScanEnd {
            forward_to: pos,
            stopped: false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wanted_follows_bytes_taken_from_the_front() {
        let mut s = Scanner::default();
        // A whole Flush ('H', 4 bytes of length: 5 bytes), then the first
        // 6 bytes of a Parse announcing 100 bytes.
        let mut buf = b"H\0\0\0\x04P\0\0\0\x64x".to_vec();
        let e = s
            .scan(&buf, 0, 1000, |t| t == b'P', |_, _| Visit::Forward)
            .unwrap();
        assert_eq!(e.forward_to, 5);
        assert_eq!(s.wanted(), 5 + 101);
        buf.drain(..e.forward_to);
        s.consumed(e.forward_to);
        // The Parse is whole when the buffer (from its new start) holds it.
        assert_eq!(s.wanted(), 101);
    }

    #[test]
    fn passes_partial_messages_and_waits_for_bodies() {
        let mut s = Scanner::default();
        // A 10-byte DataRow ('D', len 9) split after 7 bytes, then 'Z'.
        let stream = b"D\0\0\0\x09abcdeZ\0\0\0\x05I";
        let mut tags = Vec::new();
        let e = s
            .scan(
                &stream[..7],
                0,
                1000,
                |t| t == b'Z',
                |t, _| {
                    tags.push(t);
                    Visit::Forward
                },
            )
            .unwrap();
        assert_eq!(e.forward_to, 7);
        assert!(!s.at_boundary());
        // The rest of D plus a partial Z: D's tail forwards, Z waits.
        let e = s
            .scan(
                &stream[7..13],
                0,
                1000,
                |t| t == b'Z',
                |t, _| {
                    tags.push(t);
                    Visit::Forward
                },
            )
            .unwrap();
        assert_eq!(e.forward_to, 3);
        assert!(s.at_boundary());
        let mut body = Vec::new();
        let e = s
            .scan(
                &stream[10..],
                0,
                1000,
                |t| t == b'Z',
                |t, b| {
                    tags.push(t);
                    body.extend_from_slice(b);
                    Visit::Forward
                },
            )
            .unwrap();
        assert_eq!(e.forward_to, 6);
        assert_eq!(tags, b"DZ");
        assert_eq!(body, b"I");
    }

    #[test]
    fn stops_before_and_rejects_bad_length() {
        let mut s = Scanner::default();
        let e = s
            .scan(b"X\0\0\0\x04", 0, 100, |_| false, |_, _| Visit::StopBefore)
            .unwrap();
        assert_eq!(
            e,
            ScanEnd {
                forward_to: 0,
                stopped: true
            }
        );
        assert!(
            s.scan(b"Q\0\0\0\x01", 0, 100, |_| false, |_, _| Visit::Forward)
                .is_err()
        );
    }
}
