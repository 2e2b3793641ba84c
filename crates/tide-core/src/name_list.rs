//! Lists of names in a setting (`tide.database`): pure parsing, so the rules are tested here.

/// Split a comma-separated list of names as PostgreSQL's list settings are written: surrounding
/// blanks dropped, a name in double quotes taken as is (`""` in it stands for one `"`), empty
/// elements ignored. Names are not case-folded: a database name is matched exactly.
pub fn split(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut chars = s.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        let mut name = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            while let Some(c) = chars.next() {
                if c == '"' {
                    if chars.peek() == Some(&'"') {
                        chars.next();
                        name.push('"');
                    } else {
                        break;
                    }
                } else {
                    name.push(c);
                }
            }
            // Whatever follows the closing quote up to the comma is ignored, as blanks.
            for c in chars.by_ref() {
                if c == ',' {
                    break;
                }
            }
        } else {
            let mut ended = true;
            for c in chars.by_ref() {
                if c == ',' {
                    ended = false;
                    break;
                }
                name.push(c);
            }
            let name = name.trim_end().to_string();
            if !name.is_empty() {
                out.push(name);
            }
            if ended {
                break;
            }
            continue;
        }
        if !name.is_empty() {
            out.push(name);
        }
        if chars.peek().is_none() {
            break;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::split as split_list;

    #[test]
    fn lists_split_like_postgres_lists() {
        assert_eq!(split_list(""), Vec::<String>::new());
        assert_eq!(split_list("  "), Vec::<String>::new());
        assert_eq!(split_list("postgres"), vec!["postgres"]);
        assert_eq!(split_list(" a , b,c "), vec!["a", "b", "c"]);
        assert_eq!(split_list("a,,b,"), vec!["a", "b"]);
        assert_eq!(split_list("MyDb"), vec!["MyDb"], "no case folding");
        assert_eq!(split_list(r#""x, y" , z"#), vec!["x, y", "z"]);
        assert_eq!(split_list(r#""say ""hi""",b"#), vec![r#"say "hi""#, "b"]);
        assert_eq!(split_list(r#""open"#), vec!["open"]);
    }
}
