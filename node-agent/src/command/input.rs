//! The input of restore-style tools (`iptables-restore`, `nft -f`) and the lines around a failing one.
//!
//! ```text
//! RestoreInput::write_to(stdin)   (streamed: a 25 MB payload is never held twice)
//!     └─ a failure at line N ─► context_lines(input, N) ─► written again into a window of N±3, numbered
//! ```

use std::io::{self, Write};

/// Text for a restore-style tool (`iptables-restore`, `nft -f`), written on demand (possibly more than once; it must be deterministic).
pub trait RestoreInput {
    /// Writes the whole payload.
    fn write_to(&mut self, out: &mut dyn Write) -> io::Result<()>;
}

impl RestoreInput for &str {
    fn write_to(&mut self, out: &mut dyn Write) -> io::Result<()> {
        out.write_all(self.as_bytes())
    }
}

impl RestoreInput for String {
    fn write_to(&mut self, out: &mut dyn Write) -> io::Result<()> {
        out.write_all(self.as_bytes())
    }
}

/// How many lines around a failing one an error shows (kube-proxy shows 3 on each side).
pub const CONTEXT_LINES: usize = 3;

/// The lines `line - CONTEXT_LINES ..= line + CONTEXT_LINES` of `input`, numbered, the failing one
/// marked with `>`. Stops writing the input once past the window.
pub fn context_lines(input: &mut dyn RestoreInput, line: usize) -> String {
    let mut window = LineWindow::new(line.saturating_sub(CONTEXT_LINES).max(1), line + CONTEXT_LINES);
    // The window ends the write early with an error once it has its lines; that is expected.
    let _ = input.write_to(&mut window);
    window.finish(line)
}

/// A writer that keeps only lines `first..=last` (1-based) and fails once past them.
struct LineWindow {
    first: usize,
    last: usize,
    number: usize,
    current: Vec<u8>,
    kept: Vec<(usize, String)>,
}

impl LineWindow {
    fn new(first: usize, last: usize) -> Self {
        Self {
            first,
            last,
            number: 1,
            current: Vec::new(),
            kept: Vec::new(),
        }
    }

    fn finish(mut self, marked: usize) -> String {
        if !self.current.is_empty() && self.number <= self.last {
            self.kept
                .push((self.number, String::from_utf8_lossy(&self.current).into_owned()));
        }
        self.kept
            .iter()
            .map(|(n, text)| {
                let mark = if *n == marked { '>' } else { ' ' };
                format!("{mark}{n:>6} {text}")
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Write for LineWindow {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.number > self.last {
            return Err(io::Error::other("past the window"));
        }
        for &byte in buf {
            if self.number > self.last {
                break;
            }
            if byte == b'\n' {
                if self.number >= self.first {
                    self.kept
                        .push((self.number, String::from_utf8_lossy(&self.current).into_owned()));
                }
                self.current.clear();
                self.number += 1;
            } else if self.number >= self.first && self.number <= self.last {
                self.current.push(byte);
            }
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_shows_the_lines_around_the_failure() {
        let text: String = (1..=20).map(|i| format!("line{i}\n")).collect();
        let mut input = text.as_str();
        let context = context_lines(&mut input, 10);
        let lines: Vec<&str> = context.lines().collect();
        assert_eq!(lines.len(), 7);
        assert_eq!(lines[0], "      7 line7");
        assert_eq!(lines[3], ">    10 line10");
        assert_eq!(lines[6], "     13 line13");
        let mut input = text.as_str();
        assert_eq!(context_lines(&mut input, 1).lines().count(), 4);
        let mut input = "only\nno newline at end";
        assert_eq!(
            context_lines(&mut input, 2),
            "      1 only\n>     2 no newline at end"
        );
    }
}
