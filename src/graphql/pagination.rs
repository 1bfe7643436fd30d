//! Relay connections over keyset cursors: a page is "rows after this key", never an offset, so rows
//! inserted while a client pages can neither repeat nor shift rows out of its walk.

use async_graphql::connection::CursorType;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

use crate::error::{AppError, AppResult};

pub const DEFAULT_PAGE_SIZE: i32 = 20;
pub const MAX_PAGE_SIZE: i32 = 100;

/// The position after a row in a walk ordered by id (newest first).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IdCursor(pub i64);

const CURSOR_TAG: &str = "k1:";

impl CursorType for IdCursor {
    type Error = AppError;

    fn decode_cursor(s: &str) -> Result<Self, Self::Error> {
        let malformed = || AppError::bad_input("after", "malformed cursor");
        if s.len() > 64 {
            return Err(malformed());
        }
        let bytes = URL_SAFE_NO_PAD.decode(s).map_err(|_| malformed())?;
        let text = std::str::from_utf8(&bytes).map_err(|_| malformed())?;
        let id = text
            .strip_prefix(CURSOR_TAG)
            .and_then(|raw| raw.parse().ok())
            .ok_or_else(malformed)?;
        Ok(Self(id))
    }

    fn encode_cursor(&self) -> String {
        URL_SAFE_NO_PAD.encode(format!("{CURSOR_TAG}{}", self.0))
    }
}

/// A validated `first`/`after` pair.
#[derive(Clone, Copy, Debug)]
pub struct PageRequest {
    pub first: u64,
    pub after: Option<i64>,
}

impl PageRequest {
    pub fn parse(first: Option<i32>, after: Option<&str>) -> AppResult<Self> {
        let first = first.unwrap_or(DEFAULT_PAGE_SIZE);
        if !(0..=MAX_PAGE_SIZE).contains(&first) {
            return Err(AppError::bad_input(
                "first",
                format!("first must be between 0 and {MAX_PAGE_SIZE}"),
            ));
        }
        let after = after
            .map(IdCursor::decode_cursor)
            .transpose()?
            .map(|cursor| cursor.0);
        Ok(Self {
            first: first as u64,
            after,
        })
    }

    /// How many rows to fetch: one more than the page, to learn whether another page follows.
    pub fn fetch_limit(&self) -> u64 {
        self.first + 1
    }
}

/// One page of rows and whether more follow it.
pub struct Page<T> {
    pub items: Vec<T>,
    pub has_next_page: bool,
}

impl<T> Page<T> {
    /// Cuts rows fetched with [`PageRequest::fetch_limit`] down to the page.
    pub fn from_overfetch(mut items: Vec<T>, request: PageRequest) -> Self {
        let has_next_page = items.len() as u64 > request.first;
        items.truncate(request.first as usize);
        Self {
            items,
            has_next_page,
        }
    }
}

/// Complexity of a connection field: its children count once per requested row.
pub fn connection_complexity(child_complexity: usize, first: Option<i32>) -> usize {
    let rows = first.unwrap_or(DEFAULT_PAGE_SIZE).clamp(0, MAX_PAGE_SIZE) as usize;
    rows.max(1)
        .saturating_mul(child_complexity)
        .saturating_add(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip() {
        let cursor = IdCursor(981);
        assert_eq!(
            IdCursor::decode_cursor(&cursor.encode_cursor()).unwrap(),
            cursor
        );
    }

    #[test]
    fn page_size_is_bounded() {
        assert!(PageRequest::parse(Some(101), None).is_err());
        assert!(PageRequest::parse(Some(-1), None).is_err());
        assert_eq!(PageRequest::parse(None, None).unwrap().first, 20);
    }

    #[test]
    fn a_foreign_cursor_is_bad_input() {
        let err = PageRequest::parse(Some(5), Some("bm90LWEtY3Vyc29y")).unwrap_err();
        assert_eq!(err.code(), "BAD_USER_INPUT");
    }

    #[test]
    fn overfetch_reveals_the_next_page() {
        let request = PageRequest::parse(Some(2), None).unwrap();
        let page = Page::from_overfetch(vec![3, 2, 1], request);
        assert_eq!(page.items, vec![3, 2]);
        assert!(page.has_next_page);
        let last = Page::from_overfetch(vec![1], request);
        assert!(!last.has_next_page);
    }
}
