//! An incremental parser for server-sent events, as OpenAI-compatible servers stream them.
//!
//! Bytes arrive in arbitrary pieces: a line can be split across reads and one read can hold
//! many events. Complete lines are taken from the buffer; `data:` lines accumulate (joined by
//! `\n`, as the SSE spec says) until a blank line ends the event. `data: [DONE]` is OpenAI's
//! end marker. Lines may end in `\n` or `\r\n` (llama-cpp-python's sse-starlette writes `\n`,
//! others `\r\n`); comments (`: ping`) and the `event:`, `id:` and `retry:` fields are skipped.

/// One event's payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SseEvent {
    /// The `data:` of an event (usually one JSON chunk).
    Data(String),
    /// `data: [DONE]`.
    Done,
}

/// Parser state: the unfinished line and the data of the unfinished event.
#[derive(Debug, Default)]
pub struct SseParser {
    line: Vec<u8>,
    data: String,
    has_data: bool,
}

impl SseParser {
    /// Feeds the next piece of the body; completed events are appended to `out`.
    pub fn push(&mut self, bytes: &[u8], out: &mut Vec<SseEvent>) {
        let mut rest = bytes;
        while let Some(at) = rest.iter().position(|&b| b == b'\n') {
            self.line.extend_from_slice(&rest[..at]);
            rest = &rest[at + 1..];
            let mut line = std::mem::take(&mut self.line);
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            self.take_line(&line, out);
            // Reuse the allocation for the next line.
            line.clear();
            self.line = line;
        }
        self.line.extend_from_slice(rest);
    }

    /// The body ended: an event not closed by a blank line is still delivered.
    pub fn finish(&mut self, out: &mut Vec<SseEvent>) {
        if !self.line.is_empty() {
            let line = std::mem::take(&mut self.line);
            self.take_line(&line, out);
        }
        self.dispatch(out);
    }

    fn take_line(&mut self, line: &[u8], out: &mut Vec<SseEvent>) {
        if line.is_empty() {
            self.dispatch(out);
            return;
        }
        let line = String::from_utf8_lossy(line);
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line.as_ref(), ""),
        };
        if field != "data" {
            return;
        }
        if self.has_data {
            self.data.push('\n');
        }
        self.data.push_str(value);
        self.has_data = true;
    }

    fn dispatch(&mut self, out: &mut Vec<SseEvent>) {
        if !self.has_data {
            return;
        }
        self.has_data = false;
        let data = std::mem::take(&mut self.data);
        if data.trim() == "[DONE]" {
            out.push(SseEvent::Done);
        } else {
            out.push(SseEvent::Data(data));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(pieces: &[&[u8]]) -> Vec<SseEvent> {
        let mut p = SseParser::default();
        let mut out = Vec::new();
        for piece in pieces {
            p.push(piece, &mut out);
        }
        p.finish(&mut out);
        out
    }

    fn data(s: &str) -> SseEvent {
        SseEvent::Data(s.to_string())
    }

    #[test]
    fn several_events_in_one_read() {
        let body = b"data: {\"a\":1}\n\ndata: {\"a\":2}\n\ndata: [DONE]\n\n";
        assert_eq!(
            parse(&[body]),
            vec![data("{\"a\":1}"), data("{\"a\":2}"), SseEvent::Done]
        );
    }

    #[test]
    fn events_split_across_reads_at_every_byte() {
        let body = b"data: {\"text\":\"h\xc3\xa9\"}\r\n\r\n: ping\r\n\r\ndata: [DONE]\r\n\r\n";
        let want = vec![data("{\"text\":\"h\u{e9}\"}"), SseEvent::Done];
        for cut in 0..body.len() {
            assert_eq!(parse(&[&body[..cut], &body[cut..]]), want, "cut at {cut}");
        }
        let bytes: Vec<&[u8]> = body.chunks(1).collect();
        assert_eq!(parse(&bytes), want);
    }

    #[test]
    fn fields_comments_and_multiline_data() {
        let body = b"event: message\nid: 7\ndata:x\ndata: y\n\n: comment\n\nretry: 5\n\n";
        assert_eq!(parse(&[body]), vec![data("x\ny")]);
    }

    #[test]
    fn unterminated_last_event_is_delivered() {
        assert_eq!(parse(&[b"data: [DONE]"]), vec![SseEvent::Done]);
        assert_eq!(parse(&[b"data: {}\n"]), vec![data("{}")]);
        assert!(parse(&[b"", b"\n\n"]).is_empty());
    }
}
