//! Rows in the text format of `COPY ... FROM STDIN` (PostgreSQL's default `text` format:
//! tab-separated columns, one row per line, `\N` for NULL), as a remote table target's backfill
//! chunks travel (see the worker's chunk read and the remote table target).
//!
//! Guarantees: any column value (the text output of its type) reads back exactly as that text,
//! whatever it contains: backslashes, tabs, newlines and carriage returns are escaped, so no
//! value can end its column or row early, nor form the end-of-data marker `\.`; NULL (`\N`) is
//! distinct from the empty string (an empty column) and from the text `\N` (written `\\N`).
//! The encoding is the caller's (the client encoding of the COPY: UTF-8 here).

/// Append one row (its columns' text output, `None` for NULL) to `out`, ending with a newline.
pub fn push_row<'a>(out: &mut String, values: impl IntoIterator<Item = Option<&'a str>>) {
    for (i, v) in values.into_iter().enumerate() {
        if i > 0 {
            out.push('\t');
        }
        push_value(out, v);
    }
    out.push('\n');
}

/// Append one column value, escaped for the text format.
pub fn push_value(out: &mut String, v: Option<&str>) {
    let Some(v) = v else {
        out.push_str("\\N");
        return;
    };
    let mut rest = v;
    while let Some(at) = rest.find(['\\', '\t', '\n', '\r']) {
        out.push_str(&rest[..at]);
        out.push_str(match rest.as_bytes()[at] {
            b'\\' => "\\\\",
            b'\t' => "\\t",
            b'\n' => "\\n",
            _ => "\\r",
        });
        rest = &rest[at + 1..];
    }
    out.push_str(rest);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// PostgreSQL's reading of a text-format line (`CopyReadAttributesText`), enough to
    /// check that what [`push_row`] writes reads back as the values.
    fn parse_line(line: &str) -> Vec<Option<String>> {
        let mut out = Vec::new();
        for field in line.split('\t') {
            if field == "\\N" {
                out.push(None);
                continue;
            }
            let mut s = String::new();
            let mut chars = field.chars();
            while let Some(c) = chars.next() {
                if c != '\\' {
                    s.push(c);
                    continue;
                }
                match chars.next() {
                    Some('t') => s.push('\t'),
                    Some('n') => s.push('\n'),
                    Some('r') => s.push('\r'),
                    Some('b') => s.push('\u{8}'),
                    Some('f') => s.push('\u{c}'),
                    Some('v') => s.push('\u{b}'),
                    Some(o) => s.push(o),
                    None => {}
                }
            }
            out.push(Some(s));
        }
        out
    }

    fn round_trip(values: &[Option<&str>]) {
        let mut text = String::new();
        push_row(&mut text, values.iter().copied());
        let line = text.strip_suffix('\n').expect("a row ends with a newline");
        assert!(!line.contains('\n') && !line.contains('\r'), "{line:?}");
        assert_ne!(line, "\\.", "a row must never be the end-of-data marker");
        let back = parse_line(line);
        let want: Vec<Option<String>> = values.iter().map(|v| v.map(str::to_string)).collect();
        assert_eq!(back, want, "{line:?}");
    }

    #[test]
    fn values_needing_escapes_read_back_exactly() {
        round_trip(&[Some("plain"), None, Some("")]);
        round_trip(&[Some("\\N"), Some("N"), Some("\\"), Some("\\\\N")]);
        round_trip(&[Some("a\tb"), Some("line\nbreak"), Some("cr\r\nlf")]);
        round_trip(&[Some("\\."), Some("."), Some("é")]);
        round_trip(&[Some(r#"{"a": "x\ty\\n"}"#), Some("null"), None]);
        round_trip(&[None]);
        round_trip(&[Some("")]);
    }

    #[test]
    fn null_empty_and_backslash_n_are_distinct() {
        let mut s = String::new();
        push_row(&mut s, [None, Some(""), Some("\\N")]);
        assert_eq!(s, "\\N\t\t\\\\N\n");
    }

    #[test]
    fn exhaustive_short_strings_round_trip() {
        // Every string of up to 4 characters over the characters that matter.
        let alphabet = ['\\', '\t', '\n', '\r', 'N', '.', 'a'];
        let mut strings = vec![String::new()];
        let mut frontier = vec![String::new()];
        for _ in 0..4 {
            let mut next = Vec::new();
            for s in &frontier {
                for c in alphabet {
                    let mut t = s.clone();
                    t.push(c);
                    next.push(t);
                }
            }
            strings.extend(next.iter().cloned());
            frontier = next;
        }
        for s in &strings {
            round_trip(&[Some(s), None, Some(s)]);
        }
    }
}
