//! Text arguments checked the same way for every SQL backend, before any of them sees the text.
//!
//! Every string a client sends that is stored goes through [`TextRule::parse`]. Lengths count
//! characters, which is what PostgreSQL's and MariaDB's (utf8mb4) `VARCHAR(n)` count too, and NUL is
//! refused everywhere because PostgreSQL's `text` cannot hold it: valid input is valid on every backend.

use std::ops::RangeInclusive;

use crate::error::{AppError, AppResult};

/// How surrounding whitespace counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trim {
    /// Dropped: the trimmed text is counted and stored (titles, handles).
    Stored,
    /// Kept as sent and counted, but the text must have something besides whitespace (bodies).
    Kept,
    /// Whitespace is content like any other (passwords).
    Never,
}

/// Which control characters the text may contain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Controls {
    /// None at all: single-line text shown as a label (titles, handles).
    Refused,
    /// Any but NUL: free text keeps tabs, line breaks and whatever else was pasted, which every
    /// backend stores as is; NUL is the one character PostgreSQL cannot.
    AllButNul,
    /// Any: the text never reaches SQL as sent (passwords are stored only as their hash).
    Allowed,
}

/// What one text argument must look like.
#[derive(Debug, Clone)]
pub struct TextRule {
    /// The argument or input field reported as `extensions.field`.
    pub field: &'static str,
    /// How messages name the text, e.g. "a title".
    pub noun: &'static str,
    /// How many characters it may have.
    pub chars: RangeInclusive<usize>,
    /// What the length counts, in messages: "characters", or something narrower.
    pub unit: &'static str,
    pub trim: Trim,
    pub controls: Controls,
}

impl TextRule {
    /// The text as it is to be stored, or `BAD_USER_INPUT` naming the field.
    pub fn parse<'a>(&self, raw: &'a str) -> AppResult<&'a str> {
        let text = match self.trim {
            Trim::Stored => raw.trim(),
            Trim::Kept | Trim::Never => raw,
        };
        let blank = self.trim == Trim::Kept && text.trim().is_empty();
        if blank || !self.chars.contains(&text.chars().count()) {
            return Err(self.invalid());
        }
        match self.controls {
            Controls::Refused if text.chars().any(char::is_control) => {
                Err(self.refuse(format!("{} cannot contain control characters", self.noun)))
            }
            Controls::AllButNul if text.contains('\0') => {
                Err(self.refuse(format!("{} cannot contain NUL characters", self.noun)))
            }
            _ => Ok(text),
        }
    }

    /// The error for text that is not what this rule describes; for checks a caller adds on top.
    pub fn invalid(&self) -> AppError {
        self.refuse(format!(
            "{} is {}–{} {}",
            self.noun,
            self.chars.start(),
            self.chars.end(),
            self.unit
        ))
    }

    fn refuse(&self, message: String) -> AppError {
        AppError::bad_input(self.field, message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LABEL: TextRule = TextRule {
        field: "label",
        noun: "a label",
        chars: 1..=3,
        unit: "characters",
        trim: Trim::Stored,
        controls: Controls::Refused,
    };

    const NOTE: TextRule = TextRule {
        field: "note",
        noun: "a note",
        chars: 1..=3,
        unit: "characters",
        trim: Trim::Kept,
        controls: Controls::AllButNul,
    };

    fn field_of(result: AppResult<&str>) -> Option<&'static str> {
        match result {
            Err(AppError::BadUserInput { field, .. }) => field,
            _ => None,
        }
    }

    #[test]
    fn lengths_count_characters_not_bytes() {
        assert_eq!(LABEL.parse("😀😀😀").unwrap(), "😀😀😀");
        assert_eq!(field_of(LABEL.parse("éééé")), Some("label"));
    }

    #[test]
    fn stored_trimming_counts_and_returns_the_trimmed_text() {
        assert_eq!(LABEL.parse("  abc  ").unwrap(), "abc");
        assert!(LABEL.parse("   ").is_err());
    }

    #[test]
    fn kept_whitespace_counts_but_cannot_be_all_there_is() {
        assert_eq!(NOTE.parse(" a ").unwrap(), " a ");
        assert!(NOTE.parse("   ").is_err());
        assert!(NOTE.parse(" ab ").is_err());
    }

    #[test]
    fn nul_is_refused_even_where_other_controls_are_not() {
        assert_eq!(NOTE.parse("a\tb").unwrap(), "a\tb");
        assert_eq!(NOTE.parse("\u{1b}b").unwrap(), "\u{1b}b");
        assert_eq!(field_of(NOTE.parse("a\0b")), Some("note"));
        assert_eq!(field_of(LABEL.parse("a\0b")), Some("label"));
        assert_eq!(field_of(LABEL.parse("a\tb")), Some("label"));
    }
}
