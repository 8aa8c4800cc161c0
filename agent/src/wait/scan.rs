//! The matcher both waits share: finds a text in bytes that arrive in pieces (file
//! reads, ring batches), in bounded memory, and keeps the line around the match.
//!
//! A [`Scanner`] is fed chunks tagged with the absolute offset of their first byte.
//! It keeps a window of what it saw last: the final `len(text) - 1` bytes (a match
//! that began in an earlier chunk ends in this one) plus the current line before
//! them, up to [`WAIT_LINE_CAP_BYTES`], for the context of a match. Everything older
//! is dropped, so a 10 GiB file costs one chunk and a few KiB, never its size.
//!
//! The offsets of one scanner's chunks need not be contiguous: a process's stdout is
//! scanned by one scanner while stderr writes land between its chunks in the shared
//! offset space; each window byte knows its offset through [`Run`]s. A real gap in
//! the data (bytes the ring dropped, a file rewritten) is [`Scanner::reset`]: no
//! match may join bytes on either side of it.
//!
//! [`WAIT_LINE_CAP_BYTES`]: sandbox_protocol::wait::WAIT_LINE_CAP_BYTES

use memchr::memmem::Finder;

/// Where a run of window bytes with consecutive offsets begins.
#[derive(Debug, Clone, Copy)]
struct Run {
    /// Index in the window.
    at: usize,
    /// Absolute offset of that byte.
    offset: u64,
}

/// Finds one text in a stream of chunks; see the module docs.
#[derive(Debug)]
pub struct Scanner {
    finder: Finder<'static>,
    /// The cap on the line reported around a match.
    line_cap: usize,
    /// The last bytes seen (see the module docs).
    window: Vec<u8>,
    /// Offsets of the window's bytes, by runs, in window order; empty with it.
    runs: Vec<Run>,
    /// The first match, once found; the scanner then only completes its line.
    hit: Option<Hit>,
    /// Bytes fed since the last reset.
    fed: u64,
}

/// A match: where it starts, and the line around it as far as it was seen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hit {
    /// Absolute offset of the match's first byte.
    pub offset: u64,
    /// The line before the match: at most the line cap of its last bytes.
    before: Vec<u8>,
    /// The line after the match, up to its newline (excluded) or the cap.
    after: Vec<u8>,
    /// The line's end was seen (a newline, or the cap).
    complete: bool,
}

impl Scanner {
    /// A scanner for `text` keeping up to `line_cap` bytes of line around a match.
    /// Callers refuse an empty text (it would match at once, at the first byte).
    pub fn new(text: &[u8], line_cap: usize) -> Self {
        Self {
            finder: Finder::new(text).into_owned(),
            line_cap,
            window: Vec::new(),
            runs: Vec::new(),
            hit: None,
            fed: 0,
        }
    }

    fn needle_len(&self) -> usize {
        self.finder.needle().len()
    }

    /// Forgets the window: the next chunk does not continue the last one.
    pub fn reset(&mut self) {
        self.window.clear();
        self.runs.clear();
        self.fed = 0;
    }

    /// Bytes fed since the last [`Self::reset`].
    pub fn fed(&self) -> u64 {
        self.fed
    }

    /// The match, once one was found.
    pub fn hit(&self) -> Option<&Hit> {
        self.hit.as_ref()
    }

    /// Whether a match was found and its line is complete (more chunks would add
    /// nothing).
    pub fn done(&self) -> bool {
        self.hit.as_ref().is_some_and(|hit| hit.complete)
    }

    /// Scans `data`, whose first byte is at absolute `offset`. After a match, later
    /// chunks only complete the match's line.
    pub fn feed(&mut self, offset: u64, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        self.fed += data.len() as u64;
        if let Some(hit) = &mut self.hit {
            hit.extend(data, self.line_cap);
            return;
        }
        let continues = self
            .runs
            .last()
            .is_some_and(|run| run.offset + (self.window.len() - run.at) as u64 == offset);
        if !continues {
            self.runs.push(Run {
                at: self.window.len(),
                offset,
            });
        }
        // A match ending in the new bytes starts at most `len - 1` bytes before them;
        // anything earlier was searched with the previous chunk.
        let search_from = self
            .window
            .len()
            .saturating_sub(self.needle_len().saturating_sub(1));
        self.window.extend_from_slice(data);
        match self.finder.find(&self.window[search_from..]) {
            Some(at) => self.found(search_from + at),
            None => self.trim(),
        }
    }

    /// Records the match at window index `at` with its line, and drops the window.
    fn found(&mut self, at: usize) {
        let len = self.needle_len();
        let line_start = memchr::memrchr(b'\n', &self.window[..at]).map_or(0, |nl| nl + 1);
        let before_start = line_start.max(at.saturating_sub(self.line_cap));
        let mut hit = Hit {
            offset: self.offset_of(at),
            before: self.window[before_start..at].to_vec(),
            after: Vec::new(),
            // A text that ends with a newline ends its line.
            complete: self.finder.needle().last() == Some(&b'\n'),
        };
        if !hit.complete {
            hit.extend(&self.window[at + len..], self.line_cap);
        }
        self.hit = Some(hit);
        self.window = Vec::new();
        self.runs = Vec::new();
    }

    /// The absolute offset of window index `at`.
    fn offset_of(&self, at: usize) -> u64 {
        let run = self
            .runs
            .iter()
            .rev()
            .find(|run| run.at <= at)
            .or(self.runs.first());
        run.map_or(0, |run| run.offset + at.saturating_sub(run.at) as u64)
    }

    /// Keeps the last `len - 1` bytes and, before them, the current line up to the
    /// cap (a line that ended before them is dropped: it cannot hold a match's start).
    fn trim(&mut self) {
        let keep_tail = self.needle_len().saturating_sub(1);
        let len = self.window.len();
        let mut cut = len.saturating_sub(keep_tail + self.line_cap);
        let tail_start = len.saturating_sub(keep_tail);
        if let Some(nl) = memchr::memrchr(b'\n', &self.window[cut..tail_start]) {
            cut += nl + 1;
        }
        if cut == 0 {
            return;
        }
        self.window.drain(..cut);
        // Shift the runs; those wholly before the cut go, the one spanning it starts
        // at the new first byte.
        let first = self.runs.iter().rposition(|run| run.at <= cut).unwrap_or(0);
        self.runs.drain(..first);
        for run in &mut self.runs {
            if run.at <= cut {
                run.offset += (cut - run.at) as u64;
                run.at = 0;
            } else {
                run.at -= cut;
            }
        }
        if self.window.is_empty() {
            self.runs.clear();
        }
    }
}

impl Hit {
    /// Adds the bytes after the match up to the line's end or the cap.
    fn extend(&mut self, data: &[u8], cap: usize) {
        if self.complete {
            return;
        }
        let room = cap.saturating_sub(self.after.len());
        let (take, ended) = match memchr::memchr(b'\n', data) {
            Some(nl) if nl <= room => (nl, true),
            _ => (data.len().min(room), data.len() >= room),
        };
        self.after.extend_from_slice(&data[..take]);
        self.complete = ended;
    }

    /// The line holding the match, as text of at most `cap` bytes: the match itself
    /// whole (callers keep `text` within the cap), and as much of the line on each
    /// side as fits, cut at character boundaries; invalid UTF-8 becomes U+FFFD. A
    /// final `\n` or `\r\n` is left out.
    pub fn line(&self, text: &str, cap: usize) -> String {
        let before = String::from_utf8_lossy(&self.before);
        let after = String::from_utf8_lossy(&self.after);
        let budget = cap.saturating_sub(text.len());
        let take_before = before.len().min(budget - after.len().min(budget / 2));
        let take_after = after.len().min(budget - take_before);
        let mut start = before.len() - take_before;
        while !before.is_char_boundary(start) {
            start += 1;
        }
        let mut end = take_after;
        while !after.is_char_boundary(end) {
            end -= 1;
        }
        let mut line = String::with_capacity(cap.min(before.len() + text.len() + after.len()));
        line.push_str(&before[start..]);
        line.push_str(text);
        line.push_str(&after[..end]);
        if line.ends_with('\n') {
            line.pop();
            if line.ends_with('\r') {
                line.pop();
            }
        } else if self.complete && line.ends_with('\r') && end == after.len() {
            line.pop();
        }
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAP: usize = 64;

    /// Feeds `chunks` at consecutive offsets from 0; the hit, if any.
    fn scan(text: &str, chunks: &[&[u8]]) -> Option<(u64, String)> {
        let mut scanner = Scanner::new(text.as_bytes(), CAP);
        let mut offset = 0;
        for chunk in chunks {
            scanner.feed(offset, chunk);
            offset += chunk.len() as u64;
        }
        scanner.hit().map(|hit| (hit.offset, hit.line(text, CAP)))
    }

    #[test]
    fn a_match_in_one_chunk_reports_its_offset_and_line() {
        assert_eq!(
            scan("ready", &[b"booting\nserver ready on :80\nmore\n"]),
            Some((15, "server ready on :80".into()))
        );
        assert_eq!(scan("absent", &[b"booting\nserver\n"]), None);
    }

    #[test]
    fn a_match_split_across_chunks_is_found_at_every_split() {
        let data = b"xx\nhello listening on port 8080\nyy";
        let text = "listening on";
        let expected = Some((9, "hello listening on port 8080".into()));
        for split in 0..=data.len() {
            let (a, b) = data.split_at(split);
            assert_eq!(scan(text, &[a, b]), expected, "split at {split}");
        }
        // One byte at a time.
        let bytes: Vec<&[u8]> = data.chunks(1).collect();
        assert_eq!(scan(text, &bytes), expected);
    }

    #[test]
    fn the_first_match_wins_and_later_chunks_only_complete_its_line() {
        let mut scanner = Scanner::new(b"ok", CAP);
        scanner.feed(0, b"a ok b");
        assert!(!scanner.done());
        scanner.feed(6, b" c\nok again\n");
        assert!(scanner.done());
        let hit = scanner.hit().unwrap();
        assert_eq!((hit.offset, hit.line("ok", CAP)), (2, "a ok b c".into()));
    }

    #[test]
    fn the_window_stays_bounded_whatever_is_fed() {
        let text = "needle";
        let mut scanner = Scanner::new(text.as_bytes(), CAP);
        let mut offset = 0;
        // A single endless line, then many short lines.
        for chunk in [vec![b'x'; 10_000], b"ab\n".repeat(5_000)] {
            for piece in chunk.chunks(777) {
                scanner.feed(offset, piece);
                offset += piece.len() as u64;
                assert!(scanner.window.len() <= text.len() - 1 + CAP);
                assert!(scanner.runs.len() <= scanner.window.len().max(1));
            }
        }
        assert_eq!(scanner.fed(), offset);
        scanner.feed(offset, b"..needle");
        assert_eq!(scanner.hit().unwrap().offset, offset + 2);
    }

    #[test]
    fn a_long_line_is_cut_around_the_match_to_the_cap() {
        let line = format!("{}MATCH{}\n", "a".repeat(200), "b".repeat(200));
        let (offset, text) = scan("MATCH", &[line.as_bytes()]).unwrap();
        assert_eq!(offset, 200);
        assert_eq!(text.len(), CAP);
        assert!(text.contains("MATCH"), "{text}");
        assert!(text.starts_with('a') && text.ends_with('b'), "{text}");
        // Short on one side: the other side gets the room.
        let line = format!("x MATCH{}", "b".repeat(200));
        let (_, text) = scan("MATCH", &[line.as_bytes()]).unwrap();
        assert!(text.starts_with("x MATCH") && text.len() == CAP, "{text}");
    }

    #[test]
    fn lines_are_lossy_and_never_split_a_character() {
        let mut data = "é".repeat(100).into_bytes();
        data.extend_from_slice(b"\xffFOUND\xfe");
        data.extend_from_slice("ü".repeat(100).as_bytes());
        let (_, text) = scan("FOUND", &[&data]).unwrap();
        assert!(text.len() <= CAP, "{}", text.len());
        assert!(text.contains("\u{fffd}FOUND\u{fffd}"), "{text}");
        assert!(text.starts_with('é') && text.ends_with('ü'), "{text}");
    }

    #[test]
    fn a_text_ending_in_a_newline_ends_its_line() {
        let mut scanner = Scanner::new(b"done\r\n", CAP);
        scanner.feed(0, b"step\r\nall done\r\nnext line");
        assert!(scanner.done());
        assert_eq!(scanner.hit().unwrap().line("done\r\n", CAP), "all done");
        assert_eq!(
            scan("b\nc", &[b"a b\nc d\ne"]),
            Some((2, "a b\nc d".into()))
        );
    }

    #[test]
    fn chunks_of_one_stream_between_others_still_join() {
        // Stdout "liste" at 0..5, stderr wrote 5..9, stdout "ning" at 9..13.
        let mut scanner = Scanner::new(b"listening", CAP);
        scanner.feed(0, b"liste");
        scanner.feed(9, b"ning!");
        assert_eq!(scanner.hit().unwrap().offset, 0);
        // And the offset of a match after such a gap is its own.
        let mut scanner = Scanner::new(b"ning", CAP);
        scanner.feed(0, b"liste");
        scanner.feed(9, b"ning!");
        assert_eq!(scanner.hit().unwrap().offset, 9);
    }

    #[test]
    fn a_reset_forgets_what_came_before() {
        let mut scanner = Scanner::new(b"abc", CAP);
        scanner.feed(0, b"xab");
        scanner.reset();
        scanner.feed(0, b"c");
        assert!(scanner.hit().is_none());
        scanner.feed(1, b"abc");
        assert_eq!(scanner.hit().unwrap().offset, 1);
    }

    #[test]
    fn a_finished_line_before_the_tail_is_dropped() {
        let mut scanner = Scanner::new(b"zz", CAP);
        scanner.feed(0, b"line one\nline two");
        assert_eq!(scanner.window, b"line two");
        scanner.feed(17, b"z and zz");
        let hit = scanner.hit().unwrap();
        assert_eq!(
            (hit.offset, hit.line("zz", CAP)),
            (23, "line twoz and zz".into())
        );
    }

    #[test]
    fn a_one_byte_text_matches_at_chunk_starts() {
        assert_eq!(scan("x", &[b"ab", b"xc"]), Some((2, "abxc".into())));
    }
}
