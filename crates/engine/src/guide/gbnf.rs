//! llama.cpp's GBNF grammars, translated into llguidance's Lark syntax.
//!
//! GBNF: rules `name ::= alternatives` (a rule ends at a newline outside parentheses, unless
//! the next line starts with `|`; `|` may be followed by newlines), `#` comments, and the elements `"literal"`, `[class]`,
//! `[^class]`, `.`, a rule name and `( group )`, each optionally followed by `*`, `+`, `?`,
//! `{m}`, `{m,}`, `{m,n}` or `{,n}`. Literals and classes take the escapes `\n \r \t \\ \"
//! \[ \] \xHH \uHHHH \UHHHHHHHH`. The rule `root` is where the output starts.
//!
//! The translation: `start: r_root`; a rule `name` becomes `r_name` (an upper-case letter `X`
//! becomes `_x`, so distinct GBNF names stay distinct: GBNF names have no `_`); a literal
//! becomes a sequence of one-character Lark strings, and classes and `.` one-character regexes
//! written with `\x{...}` escapes only, so every lexeme is one character, as GBNF matches (a
//! longer lexeme would win over a class at the same place and never give back: `[a-z]+ |
//! "none"` must take "nope"); groups and repetitions keep their form; postfix operators may
//! follow spaces and each other. Token references (`<...>`) are refused.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

/// A GBNF source that cannot be translated, with the line it fails on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GbnfError {
    pub line: usize,
    pub msg: String,
}

impl std::fmt::Display for GbnfError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GBNF line {}: {}", self.line, self.msg)
    }
}

impl std::error::Error for GbnfError {}

type Result<T> = std::result::Result<T, GbnfError>;

/// The Lark rule name of a GBNF rule name.
fn rule_name(name: &str) -> String {
    let mut out = String::from("r_");
    for c in name.chars() {
        if c.is_ascii_uppercase() {
            out.push('_');
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// `c` inside a Lark (JSON-style) string literal.
fn push_lark_char(out: &mut String, c: char) {
    match c {
        '"' => out.push_str("\\\""),
        '\\' => out.push_str("\\\\"),
        c if (c as u32) < 0x20 || c as u32 == 0x7F => {
            let _ = write!(out, "\\u{:04x}", c as u32);
        }
        c => out.push(c),
    }
}

struct Parser<'a> {
    src: &'a [u8],
    text: &'a str,
    pos: usize,
    line: usize,
    /// Rule names referenced, with the first line that references each.
    refs: BTreeMap<String, usize>,
}

impl<'a> Parser<'a> {
    fn err<T>(&self, msg: impl Into<String>) -> Result<T> {
        Err(GbnfError {
            line: self.line,
            msg: msg.into(),
        })
    }

    fn peek(&self) -> Option<u8> {
        self.src.get(self.pos).copied()
    }

    /// Skips spaces, tabs and comments; newlines too when `newlines`.
    fn skip_space(&mut self, newlines: bool) {
        while let Some(c) = self.peek() {
            match c {
                b' ' | b'\t' => self.pos += 1,
                b'#' => {
                    while let Some(c) = self.peek() {
                        if c == b'\n' {
                            break;
                        }
                        self.pos += 1;
                    }
                }
                b'\r' | b'\n' if newlines => {
                    if c == b'\n' {
                        self.line += 1;
                    }
                    self.pos += 1;
                }
                _ => break,
            }
        }
    }

    fn is_name_byte(c: u8) -> bool {
        c.is_ascii_alphanumeric() || c == b'-'
    }

    fn name(&mut self) -> Result<String> {
        let start = self.pos;
        while self.peek().is_some_and(Self::is_name_byte) {
            self.pos += 1;
        }
        if start == self.pos {
            return self.err(format!("expected a rule name at {:?}", self.rest_preview()));
        }
        Ok(self.text[start..self.pos].to_string())
    }

    fn rest_preview(&self) -> String {
        self.text[self.pos..].chars().take(20).collect()
    }

    /// One character of a literal or class, escapes decoded.
    fn char(&mut self) -> Result<char> {
        let rest = &self.text[self.pos..];
        let mut it = rest.chars();
        let Some(c) = it.next() else {
            return self.err("unexpected end of the grammar");
        };
        if c != '\\' {
            if c == '\n' {
                return self.err("a newline inside a literal or class");
            }
            self.pos += c.len_utf8();
            return Ok(c);
        }
        let Some(e) = it.next() else {
            return self.err("an escape at the end of the grammar");
        };
        self.pos += 2;
        let hex = |p: &mut Self, n: usize| -> Result<char> {
            let digits = p.text.get(p.pos..p.pos + n).unwrap_or("");
            let v = (digits.len() == n)
                .then(|| u32::from_str_radix(digits, 16).ok())
                .flatten();
            match v.and_then(char::from_u32) {
                Some(c) => {
                    p.pos += n;
                    Ok(c)
                }
                None => p.err(format!("\\{e} needs {n} hex digits of a valid character")),
            }
        };
        match e {
            'x' => hex(self, 2),
            'u' => hex(self, 4),
            'U' => hex(self, 8),
            'n' => Ok('\n'),
            'r' => Ok('\r'),
            't' => Ok('\t'),
            '\\' | '"' | '[' | ']' | '-' | '^' => Ok(e),
            _ => self.err(format!("unknown escape \\{e}")),
        }
    }

    fn literal(&mut self, out: &mut String) -> Result<()> {
        self.pos += 1; // the opening quote
        let mut chars = Vec::new();
        loop {
            match self.peek() {
                None => return self.err("a literal without its closing quote"),
                Some(b'"') => {
                    self.pos += 1;
                    break;
                }
                Some(_) => {
                    let c = self.char()?;
                    let mut one = String::from("\"");
                    push_lark_char(&mut one, c);
                    one.push('"');
                    chars.push(one);
                }
            }
        }
        // One lexeme per character: GBNF matches character by character, and a longer
        // lexeme would win over a class at the same place without ever giving back.
        match chars.len() {
            // The empty string: an optional nothing.
            0 => out.push_str("[\"\"]"),
            1 => out.push_str(&chars[0]),
            _ => {
                out.push('(');
                out.push_str(&chars.join(" "));
                out.push(')');
            }
        }
        Ok(())
    }

    fn class(&mut self, out: &mut String) -> Result<()> {
        self.pos += 1; // '['
        let mut rx = String::from("/[");
        if self.peek() == Some(b'^') {
            self.pos += 1;
            rx.push('^');
        }
        let mut items = 0;
        loop {
            match self.peek() {
                None => return self.err("a character class without its closing ]"),
                Some(b']') => {
                    self.pos += 1;
                    break;
                }
                Some(_) => {
                    let lo = self.char()?;
                    let _ = write!(rx, "\\x{{{:x}}}", lo as u32);
                    if self.peek() == Some(b'-') && self.src.get(self.pos + 1) != Some(&b']') {
                        self.pos += 1;
                        let hi = self.char()?;
                        if hi < lo {
                            return self.err(format!("the range {lo:?}-{hi:?} is reversed"));
                        }
                        let _ = write!(rx, "-\\x{{{:x}}}", hi as u32);
                    }
                    items += 1;
                }
            }
        }
        if items == 0 {
            return self.err("an empty character class");
        }
        rx.push_str("]/");
        out.push_str(&rx);
        Ok(())
    }

    fn number(&mut self) -> Result<Option<u32>> {
        let start = self.pos;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.pos += 1;
        }
        if start == self.pos {
            return Ok(None);
        }
        match self.text[start..self.pos].parse() {
            Ok(n) => Ok(Some(n)),
            Err(_) => self.err("a repetition count too large"),
        }
    }

    /// `{m}`, `{m,}`, `{m,n}`, `{,n}` after an element: `None` for zero repetitions.
    fn braces(&mut self) -> Result<Option<String>> {
        self.pos += 1; // '{'
        self.skip_space(false);
        let min = self.number()?;
        self.skip_space(false);
        let (min, max) = if self.peek() == Some(b',') {
            self.pos += 1;
            self.skip_space(false);
            let max = self.number()?;
            (min.unwrap_or(0), max)
        } else {
            match min {
                Some(m) => (m, Some(m)),
                None => return self.err("expected a number in { }"),
            }
        };
        self.skip_space(false);
        if self.peek() != Some(b'}') {
            return self.err("expected } after a repetition count");
        }
        self.pos += 1;
        Ok(match max {
            Some(0) => None,
            Some(n) if n < min => {
                return self.err(format!("the repetition {{{min},{n}}} is reversed"))
            }
            Some(n) => Some(format!("{{{min},{n}}}")),
            None => Some(format!("{{{min},}}")),
        })
    }

    /// A sequence of elements, up to `|`, `)`, the end, or (outside parentheses) a newline.
    fn sequence(&mut self, nested: bool) -> Result<String> {
        let mut out = String::new();
        loop {
            self.skip_space(nested);
            let Some(c) = self.peek() else { break };
            let mut elem = String::new();
            match c {
                b'"' => self.literal(&mut elem)?,
                b'[' => self.class(&mut elem)?,
                b'.' => {
                    self.pos += 1;
                    elem.push_str("/(?s:.)/");
                }
                b'(' => {
                    self.pos += 1;
                    let alts = self.alternatives(true)?;
                    self.skip_space(true);
                    if self.peek() != Some(b')') {
                        return self.err("a group without its closing )");
                    }
                    self.pos += 1;
                    elem.push('(');
                    elem.push_str(&alts);
                    elem.push(')');
                }
                b'<' => return self.err("token references (<...>) are not supported"),
                c if Self::is_name_byte(c) => {
                    let save = (self.pos, self.line);
                    let name = self.name()?;
                    // `name ::=` starts the next rule: this sequence ended at the newline.
                    self.skip_space(false);
                    if self.text[self.pos..].starts_with("::=") {
                        (self.pos, self.line) = save;
                        break;
                    }
                    (self.pos, self.line) = save;
                    self.name()?;
                    self.refs.entry(name.clone()).or_insert(self.line);
                    elem.push_str(&rule_name(&name));
                }
                b'|' | b')' | b'\n' | b'\r' => break,
                _ => {
                    return self.err(format!(
                        "unexpected {:?}",
                        self.text[self.pos..].chars().next().unwrap_or(' ')
                    ))
                }
            }
            // Postfix operators, after spaces, any number of them (each applies to all before).
            let mut keep = true;
            let mut postfixed = false;
            loop {
                let save = (self.pos, self.line);
                self.skip_space(nested);
                match self.peek() {
                    Some(op @ (b'*' | b'+' | b'?')) => {
                        self.pos += 1;
                        if postfixed {
                            elem = format!("({elem})");
                        }
                        elem.push(op as char);
                        postfixed = true;
                    }
                    Some(b'{') => match self.braces()? {
                        Some(r) => {
                            elem = format!("({elem}){r}");
                            postfixed = true;
                        }
                        None => keep = false,
                    },
                    _ => {
                        (self.pos, self.line) = save;
                        break;
                    }
                }
            }
            if keep {
                if !out.is_empty() {
                    out.push(' ');
                }
                out.push_str(&elem);
            }
        }
        if out.is_empty() {
            out.push_str("[\"\"]");
        }
        Ok(out)
    }

    fn alternatives(&mut self, nested: bool) -> Result<String> {
        let mut out = self.sequence(nested)?;
        loop {
            // A `|` that starts the next line continues the rule.
            let save = (self.pos, self.line);
            self.skip_space(true);
            if self.peek() != Some(b'|') {
                (self.pos, self.line) = save;
                break;
            }
            self.pos += 1;
            self.skip_space(true);
            out.push_str(" | ");
            out.push_str(&self.sequence(nested)?);
        }
        Ok(out)
    }
}

/// Translates a GBNF grammar into llguidance's Lark syntax; errors name the line.
pub fn to_lark(src: &str) -> Result<String> {
    let mut p = Parser {
        src: src.as_bytes(),
        text: src,
        pos: 0,
        line: 1,
        refs: BTreeMap::new(),
    };
    let mut rules: Vec<(String, String)> = Vec::new();
    let mut defined = BTreeSet::new();
    loop {
        p.skip_space(true);
        if p.peek().is_none() {
            break;
        }
        let name = p.name()?;
        p.skip_space(false);
        if !p.text[p.pos..].starts_with("::=") {
            return p.err(format!("expected ::= after the rule name {name:?}"));
        }
        p.pos += 3;
        p.skip_space(true);
        let body = p.alternatives(false)?;
        p.skip_space(false);
        match p.peek() {
            None | Some(b'\n') | Some(b'\r') => {}
            Some(_) => return p.err(format!("unexpected {:?}", p.rest_preview())),
        }
        if !defined.insert(name.clone()) {
            return p.err(format!("the rule {name:?} is defined twice"));
        }
        rules.push((name, body));
    }
    if !defined.contains("root") {
        return Err(GbnfError {
            line: p.line,
            msg: "the grammar has no rule named root".into(),
        });
    }
    if let Some((name, line)) = p.refs.iter().find(|(n, _)| !defined.contains(*n)) {
        return Err(GbnfError {
            line: *line,
            msg: format!("the rule {name:?} is used but never defined"),
        });
    }
    let mut out = String::from("start: r_root\n");
    for (name, body) in rules {
        let _ = writeln!(out, "{}: {}", rule_name(&name), body);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_literals_and_operators() {
        let g = "root ::= \"a\\\"b\" item* (x | \"y\")+ item?\nitem ::= [a-z0-9] | \"\\n\"\nx ::= \"x\"{2,3} . [^\\]]";
        let lark = to_lark(g).unwrap();
        assert_eq!(
            lark,
            "start: r_root\n\
             r_root: (\"a\" \"\\\"\" \"b\") r_item* (r_x | \"y\")+ r_item?\n\
             r_item: /[\\x{61}-\\x{7a}\\x{30}-\\x{39}]/ | \"\\u000a\"\n\
             r_x: (\"x\"){2,3} /(?s:.)/ /[^\\x{5d}]/\n"
        );
    }

    #[test]
    fn names_comments_continuations_and_escapes() {
        let g = "# a comment\nroot ::= Item-A # trailing\n  | \"\\x41\\u00e9\\U0001F600\"\n\nItem-A ::= (\n  \"p\"\n  \"q\"\n)";
        let lark = to_lark(g).unwrap();
        assert!(
            lark.contains("r_root: r__item-_a | (\"A\" \"é\" \"😀\")"),
            "{lark}"
        );
        assert!(lark.contains("r__item-_a: (\"p\" \"q\")"), "{lark}");
    }

    #[test]
    fn repetition_forms() {
        let lark =
            to_lark("root ::= \"a\"{3} \"b\"{1,} \"c\"{,2} \"d\"{0} \"e\" * \"f\"+?").unwrap();
        assert_eq!(
            lark,
            "start: r_root\nr_root: (\"a\"){3,3} (\"b\"){1,} (\"c\"){0,2} \"e\"* (\"f\"+)?\n"
        );
    }

    #[test]
    fn errors_name_the_line() {
        let cases = [
            ("root ::= foo", 1, "never defined"),
            ("item ::= \"a\"", 1, "no rule named root"),
            ("root ::= \"a\"\nroot ::= \"b\"", 2, "defined twice"),
            ("root ::= \"abc", 1, "closing quote"),
            ("root ::= [z-a]", 1, "reversed"),
            ("root ::= \"\\q\"", 1, "unknown escape"),
            ("root ::= (\"a\"", 1, "closing )"),
            ("root ::= <|im_end|>", 1, "token references"),
            ("root ::= \"a\"{3,1}", 1, "reversed"),
            ("root ::= []", 1, "empty character class"),
            ("\n\nroot = \"a\"", 3, "::="),
        ];
        for (g, line, what) in cases {
            let e = to_lark(g).unwrap_err();
            assert_eq!(e.line, line, "{g}: {e}");
            assert!(e.msg.contains(what), "{g}: {e}");
        }
    }
}
