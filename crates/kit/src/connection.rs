//! Relay connection glue over the keyset pages of [`pulse_runtime::pagination`]: the cursors are issued
//! there, and only turned into edges and complexity here.

use async_graphql::OutputType;
use async_graphql::connection::{Connection, Edge, EmptyFields};
use pulse_runtime::pagination::{DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE, Page};

/// A Relay connection whose cursors are opaque strings.
pub type Connected<N> = Connection<String, N, EmptyFields, EmptyFields>;

/// A page of rows as a connection of nodes.
pub fn connection<T, N: OutputType>(page: Page<T>, node: impl Fn(T) -> N) -> Connected<N> {
    let mut connection = Connection::new(false, page.has_next_page);
    connection.edges.extend(
        page.edges
            .into_iter()
            .map(|(cursor, row)| Edge::new(cursor.into_string(), node(row))),
    );
    connection
}

/// Complexity of a connection field: its children count once per requested row.
pub fn connection_complexity(child_complexity: usize, first: Option<i32>) -> usize {
    let rows = first.unwrap_or(DEFAULT_PAGE_SIZE).clamp(0, MAX_PAGE_SIZE) as usize;
    rows.max(1)
        .saturating_mul(child_complexity)
        .saturating_add(1)
}
