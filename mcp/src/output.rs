//! Output sized for a model: which part of a long stream a result keeps, and how a
//! result's text carries a large field without repeating it.
//!
//! # What a result carries, and where
//! Clients differ in what they hand the model: Claude Code passes only
//! `structuredContent` (as JSON) when a result has it, while others (the Python and
//! TypeScript SDKs' agents, opencode, Cursor) pass only the text content. So the
//! data must be in `structuredContent`, and the text must stand on its own. A field
//! of at most [`TEXT_FULL_BYTES`] is in both (each client reads one of them, so a
//! model sees it once); a larger one, which only a caller that raised `max_bytes`
//! gets, is in `structuredContent` only, and the text names it with its size, where
//! it is, and a preview ([`text_field`]).
//!
//! # Which part is kept
//! Every stream a result returns is cut to `max_bytes` ([`Capture`] for exec, which
//! sees its output once as it streams; [`select_runs`] for logs, which the agent's
//! ring replays). Cuts land after a newline when one is near, else on a character
//! boundary, and a marker line in the text says how much was left out, so a model
//! sees where the gap is. The default keeps the tail of a failed command (the error
//! is at the end of a build log), head and tail of a successful one.

use std::collections::VecDeque;
use std::fmt::Write as _;

use sandbox_protocol::{OutputChunk, Stream};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Largest field a text rendering repeats whole. Every default `max_bytes` fits, so
/// a client that reads only text sees all a default call returns.
pub const TEXT_FULL_BYTES: usize = 64 * 1024;

/// What the text shows of a field larger than [`TEXT_FULL_BYTES`].
pub const TEXT_PREVIEW_BYTES: usize = 2 * 1024;

/// How far from a cut a newline is looked for, so whole lines are kept.
const LINE_SLACK_BYTES: usize = 512;

/// Which part of an output longer than `max_bytes` a result keeps.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Keep {
    /// The tail of a failed command (non-zero exit, signal, timeout), where the error
    /// is; the head and the tail of a successful one.
    #[default]
    Auto,
    /// The first max_bytes.
    Head,
    /// The last max_bytes.
    Tail,
    /// The first and the last max_bytes / 2, with a marker between.
    HeadTail,
}

/// [`Keep`] once the outcome is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// The first bytes.
    Head,
    /// The last bytes.
    Tail,
    /// Both ends.
    HeadTail,
}

impl Part {
    /// The name results report in `kept`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Head => "head",
            Self::Tail => "tail",
            Self::HeadTail => "head_tail",
        }
    }
}

impl Keep {
    /// The part kept of a command's output: `failed` decides [`Keep::Auto`].
    pub fn part(self, failed: bool) -> Part {
        match self {
            Self::Auto if failed => Part::Tail,
            Self::Auto | Self::HeadTail => Part::HeadTail,
            Self::Head => Part::Head,
            Self::Tail => Part::Tail,
        }
    }
}

/// One stream of a command, seen once as it is produced: its first and its last
/// `cap` bytes and how many there were, so any [`Part`] of at most `cap` bytes can
/// be cut from it at the end. Holds at most `2 * cap + 1` bytes.
#[derive(Debug)]
pub struct Capture {
    cap: usize,
    head: Vec<u8>,
    tail: VecDeque<u8>,
    total: u64,
}

/// What a [`Capture`] or a file read kept: text with the cut marked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Kept {
    /// The kept bytes as text (invalid UTF-8 replaced), with a marker line where
    /// bytes were left out.
    pub text: String,
    /// Bytes the stream had.
    pub total: u64,
    /// Bytes left out.
    pub omitted: u64,
}

impl Capture {
    /// An empty capture keeping up to `cap` bytes of each end.
    pub fn new(cap: usize) -> Self {
        Self {
            cap,
            head: Vec::new(),
            tail: VecDeque::new(),
            total: 0,
        }
    }

    /// Bytes seen so far.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Adds the stream's next bytes.
    pub fn push(&mut self, data: &[u8]) {
        self.total += data.len() as u64;
        // One byte more than a cut keeps, so a cut can tell whether it ends a line.
        let room = (self.cap + 1).saturating_sub(self.head.len());
        self.head.extend_from_slice(&data[..data.len().min(room)]);
        // The tail holds the newest `cap + 1` bytes of everything: one more than a
        // cut keeps, so a cut can tell whether it starts a line.
        let ring = self.cap + 1;
        let data = &data[data.len().saturating_sub(ring)..];
        let excess = (self.tail.len() + data.len()).saturating_sub(ring);
        self.tail.drain(..excess);
        self.tail.extend(data);
    }

    /// The last line so far (at most 200 characters), for progress: looked for in
    /// the last [`LINE_SLACK_BYTES`] only, which progress reads after every chunk.
    pub fn last_line(&self) -> Option<String> {
        let from = self.tail.len().saturating_sub(LINE_SLACK_BYTES);
        let bytes: Vec<u8> = self.tail.range(from..).copied().collect();
        last_line(&bytes)
    }

    /// The part that `part` asks for whose text takes at most `budget` bytes once
    /// encoded as a JSON string ([`json_len`]): JSON writes a control byte as six
    /// (`\u0000`), so a cut by raw bytes alone let 16 KiB of NUL bytes cost 96 KiB
    /// in each part of a result. Printable text is cut as by [`Capture::keep`], a
    /// little shorter for its escaped newlines and quotes.
    pub fn keep_encoded(&self, part: Part, budget: usize) -> Kept {
        let mut max = budget;
        let mut round = 0u32;
        loop {
            let kept = self.keep(part, max);
            let cost = json_len(&kept.text);
            if cost <= budget || max == 0 {
                return kept;
            }
            // Shrink in proportion to the overshoot (two rounds for uniform text), by
            // at least 1/1024 (a cut that snapped to a line end can overshoot by a
            // little), and after 16 rounds by at least 1/16, so it always ends.
            let scaled = u128::try_from(max).unwrap_or(u128::MAX)
                * u128::try_from(budget).unwrap_or(u128::MAX)
                / u128::try_from(cost).unwrap_or(u128::MAX);
            let scaled = usize::try_from(scaled).unwrap_or(max);
            let step = if round < 16 { max / 1024 } else { max / 16 };
            max = scaled.min(max - step - 1);
            round += 1;
        }
    }

    /// The part of at most `max` bytes that `part` asks for.
    pub fn keep(&self, part: Part, max: usize) -> Kept {
        if self.total <= max as u64 {
            return Kept {
                text: String::from_utf8_lossy(&self.head).into_owned(),
                total: self.total,
                omitted: 0,
            };
        }
        let (head_bytes, tail_bytes) = match part {
            Part::Head => (max, 0),
            Part::Tail => (0, max),
            Part::HeadTail => (max / 2, max - max / 2),
        };
        let head = &self.head[..head_end(&self.head, head_bytes.min(self.head.len()))];
        let tail: Vec<u8> = self.tail.iter().copied().collect();
        let from = tail.len() - tail_bytes.min(tail.len());
        let tail = &tail[tail_start(&tail, from)..];
        let omitted = self.total - head.len() as u64 - tail.len() as u64;
        Kept {
            text: join_with_marker(head, tail, omitted),
            total: self.total,
            omitted,
        }
    }
}

/// The bytes `text` takes inside a JSON string, as serde_json writes it: `"`, `\\`
/// and the short escapes (`\n`, `\t`, ...) two, other control characters six
/// (`\u001b`), everything else itself.
pub fn json_len(text: &str) -> usize {
    text.bytes()
        .map(|byte| match byte {
            b'"' | b'\\' | b'\n' | b'\r' | b'\t' | 0x08 | 0x0c => 2,
            0x00..=0x1f => 6,
            _ => 1,
        })
        .sum()
}

/// `head`, a marker line saying `omitted` bytes were left out, then `tail`.
pub fn join_with_marker(head: &[u8], tail: &[u8], omitted: u64) -> String {
    let mut text = String::from_utf8_lossy(head).into_owned();
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    let _ = writeln!(text, "[... {} omitted ...]", size(omitted));
    text.push_str(&String::from_utf8_lossy(tail));
    text
}

/// Where a cut that keeps about `want` leading bytes ends: after the last newline
/// within [`LINE_SLACK_BYTES`] before `want`, else at a character boundary.
pub fn head_end(data: &[u8], want: usize) -> usize {
    let want = want.min(data.len());
    if want == data.len() {
        return want;
    }
    let window = &data[want.saturating_sub(LINE_SLACK_BYTES)..want];
    if let Some(newline) = window.iter().rposition(|&b| b == b'\n') {
        return want - window.len() + newline + 1;
    }
    char_end(data, want)
}

/// Where a cut that keeps the bytes from about `from` on starts: after the first
/// newline within [`LINE_SLACK_BYTES`] from `from`, else at a character boundary.
pub fn tail_start(data: &[u8], from: usize) -> usize {
    if from == 0 || from >= data.len() {
        return from.min(data.len());
    }
    // A cut right after a newline already starts a line.
    if data[from - 1] == b'\n' {
        return from;
    }
    let window = &data[from..data.len().min(from + LINE_SLACK_BYTES)];
    match window.iter().position(|&b| b == b'\n') {
        Some(newline) if from + newline + 1 < data.len() => from + newline + 1,
        _ => char_start(data, from),
    }
}

/// The nearest character boundary at or after `at` (UTF-8 continuation bytes are
/// skipped, at most three).
pub fn char_start(data: &[u8], at: usize) -> usize {
    let mut at = at.min(data.len());
    let stop = (at + 3).min(data.len());
    while at < stop && data[at] & 0xC0 == 0x80 {
        at += 1;
    }
    at
}

/// The length of the longest prefix of `data` that does not end inside a UTF-8
/// character.
pub fn whole_chars(data: &[u8]) -> usize {
    let len = data.len();
    for back in 1..=len.min(4) {
        let byte = data[len - back];
        if byte & 0xC0 == 0x80 {
            continue;
        }
        let needs = match byte {
            0xF0.. => 4,
            0xE0.. => 3,
            0xC0.. => 2,
            _ => 1,
        };
        return if back < needs { len - back } else { len };
    }
    len
}

/// The nearest character boundary at or before `at`.
pub fn char_end(data: &[u8], at: usize) -> usize {
    let mut at = at.min(data.len());
    let stop = at.saturating_sub(3);
    while at > stop && at < data.len() && data[at] & 0xC0 == 0x80 {
        at -= 1;
    }
    at
}

/// The last non-empty line of `data`, at most 200 characters.
pub fn last_line(data: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(data);
    let line = text.lines().rev().find(|line| !line.trim().is_empty())?;
    let line: String = line.chars().take(200).collect();
    Some(line)
}

/// A byte count as a model reads it: `512 bytes`, `16.0 KiB`, `3.0 MiB`.
pub fn size(bytes: u64) -> String {
    const KIB: u64 = 1024;
    const MIB: u64 = 1024 * 1024;
    // Display only: a rounded f64 of a byte count is exact enough.
    #[allow(clippy::cast_precision_loss)]
    match bytes {
        1 => "1 byte".to_owned(),
        0..KIB => format!("{bytes} bytes"),
        KIB..MIB => format!("{:.1} KiB", bytes as f64 / KIB as f64),
        _ => format!("{:.1} MiB", bytes as f64 / MIB as f64),
    }
}

/// A field in a text rendering: whole up to [`TEXT_FULL_BYTES`]; past that, its
/// size, where the whole is, and its last (or `first`) lines within
/// [`TEXT_PREVIEW_BYTES`].
pub fn text_field(field: &str, value: &str, first: bool) -> String {
    if value.len() <= TEXT_FULL_BYTES {
        return value.to_owned();
    }
    let bytes = value.as_bytes();
    let (what, preview) = if first {
        let end = head_end(bytes, TEXT_PREVIEW_BYTES);
        ("first", &bytes[..end])
    } else {
        let from = bytes.len() - TEXT_PREVIEW_BYTES;
        ("last", &bytes[tail_start(bytes, from)..])
    };
    let mut out = format!(
        "({} in structuredContent.{field}, not repeated here; its {what} lines follow. A \
         client that shows only this text sees fields of up to {} whole: ask for \
         max_bytes of at most {TEXT_FULL_BYTES}.)\n",
        size(bytes.len() as u64),
        size(TEXT_FULL_BYTES as u64),
    );
    out.push_str(&String::from_utf8_lossy(preview));
    out
}

/// A run of one stream's output, as logs returns it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct OutputRun {
    /// "stdout", "stderr" or "pty" (a terminal's output).
    pub stream: String,
    /// Offset of its first byte in the process's output (the offsets cursors count).
    pub offset: u64,
    /// The bytes as text (invalid UTF-8 replaced).
    pub text: String,
}

/// A stream as results name it.
pub fn stream_name(stream: Stream) -> &'static str {
    match stream {
        Stream::Stdout => "stdout",
        Stream::Stderr => "stderr",
        Stream::Pty => "pty",
    }
}

/// What [`select_runs`] kept of a logs batch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Runs {
    /// The kept output in the order it was written, one run per stream switch.
    pub runs: Vec<OutputRun>,
    /// Offset of the first byte kept (the end of the output when nothing was).
    pub from: u64,
    /// One past the last byte kept: the cursor that continues after it.
    pub to: u64,
}

/// Cuts `chunks` (in written order, contiguous from the first one's offset to
/// `end`) to at most `max` bytes: the first ones for [`Part::Head`], else the last.
pub fn select_runs(chunks: &[OutputChunk], end: u64, part: Part, max: usize) -> Runs {
    let mut flat = Vec::new();
    let mut marks: Vec<(usize, Stream, u64)> = Vec::new();
    for chunk in chunks {
        marks.push((flat.len(), chunk.stream, chunk.offset));
        flat.extend_from_slice(&chunk.data);
    }
    let first = chunks.first().map_or(end, |chunk| chunk.offset);
    let (a, b) = if flat.len() <= max {
        (0, flat.len())
    } else if part == Part::Head {
        (0, head_end(&flat, max))
    } else {
        (tail_start(&flat, flat.len() - max), flat.len())
    };
    let mut runs: Vec<OutputRun> = Vec::new();
    let mut pending: Option<(Stream, u64, Vec<u8>)> = None;
    for (i, &(start, stream, offset)) in marks.iter().enumerate() {
        let stop = marks.get(i + 1).map_or(flat.len(), |next| next.0);
        let (lo, hi) = (start.max(a), stop.min(b));
        if lo >= hi {
            continue;
        }
        let bytes = &flat[lo..hi];
        match &mut pending {
            Some((current, _, data)) if *current == stream => data.extend_from_slice(bytes),
            _ => {
                if let Some((stream, offset, data)) = pending.take() {
                    runs.push(run(stream, offset, &data));
                }
                pending = Some((stream, offset + (lo - start) as u64, bytes.to_vec()));
            }
        }
    }
    if let Some((stream, offset, data)) = pending {
        runs.push(run(stream, offset, &data));
    }
    Runs {
        runs,
        from: first + a as u64,
        to: first + b as u64,
    }
}

fn run(stream: Stream, offset: u64, data: &[u8]) -> OutputRun {
    OutputRun {
        stream: stream_name(stream).to_owned(),
        offset,
        text: String::from_utf8_lossy(data).into_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(count: usize) -> Vec<u8> {
        (0..count)
            .map(|n| format!("line {n:04}\n"))
            .collect::<String>()
            .into_bytes()
    }

    #[test]
    fn a_short_stream_is_kept_whole_whatever_the_part() {
        let mut capture = Capture::new(100);
        capture.push(b"hello\n");
        for part in [Part::Head, Part::Tail, Part::HeadTail] {
            let kept = capture.keep(part, 100);
            assert_eq!((kept.text.as_str(), kept.omitted), ("hello\n", 0));
        }
    }

    #[test]
    fn json_len_counts_what_serde_json_writes() {
        for text in [
            "plain",
            "a\nb\t\"q\" \\",
            "\0\u{1b}[0m\u{7f}",
            "caf\u{e9} \u{fffd}",
            "",
        ] {
            let encoded = serde_json::to_string(text).unwrap();
            assert_eq!(json_len(text), encoded.len() - 2, "{text:?}");
        }
    }

    /// Regression: 3 MB of NUL bytes cut to 16 KiB still cost 96 KiB as JSON.
    #[test]
    fn a_cut_by_encoded_bytes_bounds_control_bytes_too() {
        let budget = 16 * 1024;
        for data in [
            vec![0u8; 3_000_000],
            b"x\n".repeat(1_500_000),
            vec![0xff; 100_000],
        ] {
            let mut capture = Capture::new(budget);
            for piece in data.chunks(65_536) {
                capture.push(piece);
            }
            for part in [Part::Head, Part::Tail, Part::HeadTail] {
                let kept = capture.keep_encoded(part, budget);
                let cost = json_len(&kept.text);
                assert!(cost <= budget, "{part:?}: {cost} bytes encoded");
                assert!(cost > budget / 2, "{part:?}: only {cost} bytes kept");
                assert!(kept.omitted > 0 && kept.text.contains("omitted"));
            }
        }
        // Short printable output is kept whole.
        let mut capture = Capture::new(budget);
        capture.push(b"hello\n");
        assert_eq!(capture.keep_encoded(Part::Tail, budget).text, "hello\n");
    }

    #[test]
    fn the_tail_keeps_the_last_lines_and_marks_the_cut() {
        let data = lines(1000); // 10 bytes a line
        let mut capture = Capture::new(100);
        for piece in data.chunks(7) {
            capture.push(piece);
        }
        let kept = capture.keep(Part::Tail, 100);
        assert_eq!(kept.total, 10_000);
        assert!(
            kept.text
                .starts_with("[... 9.7 KiB omitted ...]\nline 0990\n"),
            "{}",
            kept.text
        );
        assert!(kept.text.ends_with("line 0999\n"), "{}", kept.text);
        assert_eq!(kept.omitted, 9_900);
        let kept = capture.keep(Part::Head, 100);
        assert!(kept.text.starts_with("line 0000\n"), "{}", kept.text);
        assert!(
            kept.text
                .ends_with("line 0009\n[... 9.7 KiB omitted ...]\n"),
            "{}",
            kept.text
        );
        let kept = capture.keep(Part::HeadTail, 100);
        assert!(kept.text.starts_with("line 0000\n"), "{}", kept.text);
        assert!(
            kept.text
                .contains("line 0004\n[... 9.7 KiB omitted ...]\nline 0995\n"),
            "{}",
            kept.text
        );
        assert!(kept.text.ends_with("line 0999\n"), "{}", kept.text);
    }

    #[test]
    fn a_cut_without_newlines_lands_on_a_character_boundary() {
        let data = "é".repeat(100).into_bytes(); // 2 bytes each
        let mut capture = Capture::new(51);
        capture.push(&data);
        let kept = capture.keep(Part::Tail, 51);
        assert!(!kept.text.contains('\u{fffd}'), "{}", kept.text);
        assert!(kept.text.ends_with(&"é".repeat(25)), "{}", kept.text);
        let kept = capture.keep(Part::Head, 51);
        assert!(!kept.text.contains('\u{fffd}'), "{}", kept.text);
    }

    #[test]
    fn a_prefix_never_ends_inside_a_character() {
        assert_eq!(whole_chars(b"abc"), 3);
        assert_eq!(whole_chars("aé".as_bytes()), 3);
        assert_eq!(whole_chars(&"aé".as_bytes()[..2]), 1);
        assert_eq!(whole_chars(&"a€".as_bytes()[..3]), 1);
        assert_eq!(whole_chars(&"a😀".as_bytes()[..4]), 1);
        assert_eq!(whole_chars("a😀".as_bytes()), 5);
        assert_eq!(whole_chars(b""), 0);
    }

    #[test]
    fn auto_keeps_the_tail_of_a_failure_and_both_ends_of_a_success() {
        assert_eq!(Keep::Auto.part(true), Part::Tail);
        assert_eq!(Keep::Auto.part(false), Part::HeadTail);
        assert_eq!(Keep::Head.part(true), Part::Head);
    }

    #[test]
    fn the_capture_holds_only_its_ends() {
        let mut capture = Capture::new(10);
        for _ in 0..1000 {
            capture.push(&[b'x'; 33]);
        }
        assert_eq!(capture.head.len(), 11);
        assert_eq!(capture.tail.len(), 11);
        assert_eq!(capture.total(), 33_000);
    }

    fn chunk(stream: Stream, offset: u64, data: &str) -> OutputChunk {
        OutputChunk {
            stream,
            offset,
            data: data.as_bytes().to_vec(),
        }
    }

    #[test]
    fn runs_keep_the_written_order_of_both_streams() {
        let chunks = [
            chunk(Stream::Stdout, 10, "a\n"),
            chunk(Stream::Stdout, 12, "b\n"),
            chunk(Stream::Stderr, 14, "E\n"),
            chunk(Stream::Stdout, 16, "c\n"),
        ];
        let runs = select_runs(&chunks, 18, Part::Tail, 100);
        let got: Vec<(&str, u64, &str)> = runs
            .runs
            .iter()
            .map(|r| (r.stream.as_str(), r.offset, r.text.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("stdout", 10, "a\nb\n"),
                ("stderr", 14, "E\n"),
                ("stdout", 16, "c\n")
            ]
        );
        assert_eq!((runs.from, runs.to), (10, 18));
        // The last 4 bytes, on a line boundary.
        let tail = select_runs(&chunks, 18, Part::Tail, 4);
        assert_eq!((tail.from, tail.to), (14, 18));
        assert_eq!(tail.runs[0].text, "E\n");
        // The first 5 bytes end after the last whole line: "a\nb\n".
        let head = select_runs(&chunks, 18, Part::Head, 5);
        assert_eq!((head.from, head.to), (10, 14));
        assert_eq!(head.runs.len(), 1);
        let none = select_runs(&[], 42, Part::Tail, 10);
        assert_eq!((none.from, none.to, none.runs.len()), (42, 42, 0));
    }

    #[test]
    fn a_large_field_is_named_and_previewed_in_the_text() {
        let small = "x\n".repeat(10);
        assert_eq!(text_field("stdout", &small, false), small);
        let big = String::from_utf8(lines(10_000)).unwrap();
        let text = text_field("stdout", &big, false);
        assert!(
            text.starts_with("(97.7 KiB in structuredContent.stdout"),
            "{text}"
        );
        assert!(text.ends_with("line 9999\n"), "{text}");
        assert!(text.len() < TEXT_PREVIEW_BYTES + 400, "{}", text.len());
        let text = text_field("content", &big, true);
        assert!(text.contains("first lines"), "{text}");
        assert!(text.contains("\nline 0000\n"), "{text}");
    }

    #[test]
    fn sizes_read_like_a_person_writes_them() {
        assert_eq!(size(512), "512 bytes");
        assert_eq!(size(16 * 1024), "16.0 KiB");
        assert_eq!(size(3 * 1024 * 1024), "3.0 MiB");
    }
}
