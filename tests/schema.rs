//! The checked-in `schema.graphql` is what clients code against; it must match the code.

#[test]
fn schema_graphql_matches_the_code() {
    let checked_in =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/schema.graphql"))
            .expect("schema.graphql exists");
    assert!(
        checked_in == pulse::graphql::schema::sdl(),
        "schema.graphql is stale: run `cargo run -- print-schema > schema.graphql`"
    );
}
