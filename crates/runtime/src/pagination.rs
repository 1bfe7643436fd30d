//! Keyset pagination, independent of any domain and of GraphQL: a page is "rows after this
//! position", never an offset, so rows inserted while a client pages can neither repeat nor shift
//! rows out of its walk.
//!
//! A position is `(sort key, id)`: the key orders the walk (a time, a score, or nothing when the id
//! alone orders it) and the id breaks ties, so every position is unique. Cursors are opaque to
//! clients: base64url of `walk|key|id`, where the walk names what is paged (`articles:new`), so a
//! cursor handed back to another list is refused as `BAD_USER_INPUT` instead of silently paging the
//! wrong rows.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

use crate::error::{AppError, AppResult};

pub const DEFAULT_PAGE_SIZE: i32 = 20;
pub const MAX_PAGE_SIZE: i32 = 100;

/// Longest cursor accepted, in characters. Far above any cursor we issue; bounds the decoding work a
/// client can ask for.
pub const MAX_CURSOR_CHARS: usize = 128;

/// What a cursor pages, e.g. `articles:new`. Never contains `|`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Walk(pub &'static str);

/// The part of a position that orders a walk before the id does.
pub trait SortKey: Sized {
    fn write(&self) -> String;
    fn read(raw: &str) -> Option<Self>;
}

/// Walks ordered by id alone.
impl SortKey for () {
    fn write(&self) -> String {
        String::new()
    }

    fn read(raw: &str) -> Option<Self> {
        raw.is_empty().then_some(())
    }
}

/// Walks ordered by an integer: a time in milliseconds, an integer score.
impl SortKey for i64 {
    fn write(&self) -> String {
        self.to_string()
    }

    fn read(raw: &str) -> Option<Self> {
        raw.parse().ok()
    }
}

/// Where a walk stands: just after the row with this sort key and id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Position<K> {
    pub key: K,
    pub id: i64,
}

impl Position<()> {
    /// The position of a row in a walk ordered by id alone.
    pub fn id(id: i64) -> Self {
        Self { key: (), id }
    }
}

/// An issued cursor: opaque text for the client to send back as `after`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cursor(String);

impl Cursor {
    pub fn encode<K: SortKey>(walk: Walk, position: &Position<K>) -> Self {
        let text = format!("{}|{}|{}", walk.0, position.key.write(), position.id);
        Self(URL_SAFE_NO_PAD.encode(text))
    }

    /// The position `raw` stands for in `walk`: `BAD_USER_INPUT` when it is malformed, too long, or
    /// a cursor of another walk.
    pub fn decode<K: SortKey>(walk: Walk, raw: &str) -> AppResult<Position<K>> {
        let malformed = || AppError::bad_input("after", "malformed cursor");
        if raw.len() > MAX_CURSOR_CHARS {
            return Err(malformed());
        }
        let bytes = URL_SAFE_NO_PAD.decode(raw).map_err(|_| malformed())?;
        let text = std::str::from_utf8(&bytes).map_err(|_| malformed())?;
        let (tag, rest) = text.split_once('|').ok_or_else(malformed)?;
        let (key, id) = rest.rsplit_once('|').ok_or_else(malformed)?;
        if tag != walk.0 {
            return Err(AppError::bad_input(
                "after",
                "this cursor belongs to another list",
            ));
        }
        Ok(Position {
            key: K::read(key).ok_or_else(malformed)?,
            id: id.parse().map_err(|_| malformed())?,
        })
    }

    pub fn into_string(self) -> String {
        self.0
    }
}

/// A list's `first`, checked against its largest page with one wording for every list: the one
/// place a page size is validated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageSize(usize);

impl PageSize {
    /// `first` when it is within `0..=max`; `BAD_USER_INPUT` on `first` otherwise.
    pub fn parse(first: i32, max: i32) -> AppResult<Self> {
        if !(0..=max).contains(&first) {
            return Err(AppError::bad_input(
                "first",
                format!("first is {first}; it must be between 0 and {max}"),
            ));
        }
        Ok(Self(first as usize))
    }

    pub fn get(self) -> usize {
        self.0
    }
}

/// A validated `first`/`after` pair for one walk.
#[derive(Clone, Copy, Debug)]
pub struct PageRequest<K = ()> {
    pub walk: Walk,
    pub first: u64,
    pub after: Option<Position<K>>,
}

impl<K: SortKey> PageRequest<K> {
    pub fn parse(walk: Walk, first: Option<i32>, after: Option<&str>) -> AppResult<Self> {
        let first = PageSize::parse(first.unwrap_or(DEFAULT_PAGE_SIZE), MAX_PAGE_SIZE)?;
        Ok(Self {
            walk,
            first: first.get() as u64,
            after: after.map(|raw| Cursor::decode(walk, raw)).transpose()?,
        })
    }

    /// How many rows to fetch: one more than the page, to learn whether another page follows.
    pub fn fetch_limit(&self) -> u64 {
        self.first + 1
    }
}

/// One page of rows, each with the cursor just after it, and whether more follow.
pub struct Page<T> {
    pub edges: Vec<(Cursor, T)>,
    pub has_next_page: bool,
}

impl<T> Page<T> {
    /// Cuts rows fetched with [`PageRequest::fetch_limit`] down to the page and gives each its
    /// cursor, from the row's `position` in the walk.
    pub fn from_overfetch<K: SortKey>(
        mut rows: Vec<T>,
        request: &PageRequest<K>,
        position: impl Fn(&T) -> Position<K>,
    ) -> Self {
        let has_next_page = rows.len() as u64 > request.first;
        rows.truncate(request.first as usize);
        let edges = rows
            .into_iter()
            .map(|row| (Cursor::encode(request.walk, &position(&row)), row))
            .collect();
        Self {
            edges,
            has_next_page,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NEW: Walk = Walk("articles:new");
    const FEED: Walk = Walk("feed");

    #[test]
    fn cursors_round_trip() {
        let position = Position::id(981);
        let cursor = Cursor::encode(NEW, &position).into_string();
        assert_eq!(Cursor::decode::<()>(NEW, &cursor).unwrap(), position);
    }

    #[test]
    fn cursors_with_a_sort_key_round_trip() {
        let position = Position {
            key: -1_763_800_000_000_i64,
            id: 42,
        };
        let cursor = Cursor::encode(FEED, &position).into_string();
        assert_eq!(Cursor::decode::<i64>(FEED, &cursor).unwrap(), position);
    }

    #[test]
    fn a_cursor_of_another_walk_is_bad_input() {
        let cursor = Cursor::encode(FEED, &Position::id(7)).into_string();
        let err = Cursor::decode::<()>(NEW, &cursor).unwrap_err();
        assert_eq!(err.code(), "BAD_USER_INPUT");
        assert!(err.to_string().contains("another list"), "{err}");
    }

    #[test]
    fn malformed_cursors_are_bad_input() {
        let with_key = Cursor::encode(FEED, &Position { key: 5_i64, id: 7 }).into_string();
        for raw in [
            "bm90LWEtY3Vyc29y",
            "not base64!",
            &URL_SAFE_NO_PAD.encode("articles:new|x|7"),
            &URL_SAFE_NO_PAD.encode("articles:new||seven"),
            &URL_SAFE_NO_PAD.encode([0xff, 0xfe]),
        ] {
            let err = Cursor::decode::<()>(NEW, raw).unwrap_err();
            assert_eq!(err.code(), "BAD_USER_INPUT", "{raw}");
            assert!(err.to_string().contains("malformed"), "{raw}: {err}");
        }
        assert!(Cursor::decode::<()>(FEED, &with_key).is_err());
    }

    #[test]
    fn overlong_cursors_are_refused_before_decoding() {
        let long = URL_SAFE_NO_PAD.encode(format!("articles:new||{}", "1".repeat(100)));
        assert!(long.len() > MAX_CURSOR_CHARS);
        let err = Cursor::decode::<()>(NEW, &long).unwrap_err();
        assert!(err.to_string().contains("malformed"), "{err}");
    }

    #[test]
    fn page_sizes_outside_the_list_s_bounds_are_bad_input_in_one_wording() {
        assert_eq!(PageSize::parse(0, 10).unwrap().get(), 0);
        assert_eq!(PageSize::parse(10, 10).unwrap().get(), 10);
        for (first, max) in [(11, 10), (-1, 100)] {
            let err = PageSize::parse(first, max).unwrap_err();
            assert_eq!(err.code(), "BAD_USER_INPUT");
            assert!(
                err.to_string()
                    .contains(&format!("first is {first}; it must be between 0 and {max}")),
                "{err}"
            );
        }
    }

    #[test]
    fn page_size_is_bounded() {
        assert!(PageRequest::<()>::parse(NEW, Some(101), None).is_err());
        assert!(PageRequest::<()>::parse(NEW, Some(-1), None).is_err());
        assert_eq!(PageRequest::<()>::parse(NEW, None, None).unwrap().first, 20);
    }

    #[test]
    fn overfetch_reveals_the_next_page_and_gives_each_row_its_cursor() {
        let request = PageRequest::<()>::parse(NEW, Some(2), None).unwrap();
        let page = Page::from_overfetch(vec![3, 2, 1], &request, |&id| Position::id(id));
        assert!(page.has_next_page);
        let rows: Vec<i64> = page.edges.iter().map(|(_, row)| *row).collect();
        assert_eq!(rows, vec![3, 2]);
        let (last_cursor, _) = page.edges.last().unwrap();
        let next = PageRequest::<()>::parse(NEW, Some(2), Some(last_cursor.0.as_str())).unwrap();
        assert_eq!(next.after, Some(Position::id(2)));
        let last = Page::from_overfetch(vec![1], &request, |&id| Position::id(id));
        assert!(!last.has_next_page);
    }
}
