//! A job's entry type as a stream entry's fields, and back.
//!
//! A stream entry is flat: field names and string values, written by a Lua script's `XADD` in the
//! same atomic step as the domain's other writes, or by [`super::enqueue`]. A job declares its
//! entry as a serde struct of scalar fields; this module writes each field as the string a script
//! writes (integers in decimal, `true`/`false` as `1`/`0`, `None` as an empty string) and reads
//! them back, so an entry written by a script, by an older build or by this one decodes alike.
//! A missing `Option` field, or an empty one, is `None`.

use std::collections::HashMap;
use std::fmt::Display;

use serde::de::{self, DeserializeOwned, IntoDeserializer, MapAccess, Visitor};
use serde::ser::{self, Impossible, Serialize, SerializeStruct};

/// Why an entry's fields are not the job's entry type, or a value cannot be written as fields.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct FieldsError(String);

impl de::Error for FieldsError {
    fn custom<T: Display>(msg: T) -> Self {
        Self(msg.to_string())
    }
}

impl ser::Error for FieldsError {
    fn custom<T: Display>(msg: T) -> Self {
        Self(msg.to_string())
    }
}

/// `value`'s fields, in declaration order, as an `XADD` takes them.
pub fn to_fields<T: Serialize>(value: &T) -> Result<Vec<(String, String)>, FieldsError> {
    value.serialize(StructWriter::default())
}

/// The entry type `T` from a stream entry's fields.
pub fn from_fields<T: DeserializeOwned>(
    fields: &HashMap<String, String>,
) -> Result<T, FieldsError> {
    T::deserialize(EntryReader { fields })
}

struct EntryReader<'a> {
    fields: &'a HashMap<String, String>,
}

impl<'de> de::Deserializer<'de> for EntryReader<'_> {
    type Error = FieldsError;

    fn deserialize_any<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, FieldsError> {
        Err(FieldsError(
            "a job's entry type must be a struct of named fields".to_owned(),
        ))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        names: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, FieldsError> {
        // Only the declared fields, so an entry carrying one more (a newer producer) still decodes.
        let present = names
            .iter()
            .filter_map(|name| Some((*name, self.fields.get(*name)?.as_str())));
        visitor.visit_map(Fields {
            present: present.collect::<Vec<_>>().into_iter(),
            value: None,
        })
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
        ignored_any
    }
}

struct Fields<'a> {
    present: std::vec::IntoIter<(&'static str, &'a str)>,
    value: Option<&'a str>,
}

impl<'de> MapAccess<'de> for Fields<'_> {
    type Error = FieldsError;

    fn next_key_seed<K: de::DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, FieldsError> {
        let Some((name, value)) = self.present.next() else {
            return Ok(None);
        };
        self.value = Some(value);
        seed.deserialize(name.into_deserializer()).map(Some)
    }

    fn next_value_seed<V: de::DeserializeSeed<'de>>(
        &mut self,
        seed: V,
    ) -> Result<V::Value, FieldsError> {
        let value = self.value.take().unwrap_or_default();
        seed.deserialize(Value(value))
    }
}

/// One field's string, read as whatever the entry type's field is.
struct Value<'a>(&'a str);

impl Value<'_> {
    fn parse<T: std::str::FromStr>(&self, what: &str) -> Result<T, FieldsError> {
        self.0
            .parse()
            .map_err(|_| FieldsError(format!("{:?} is not {what}", self.0)))
    }
}

macro_rules! parse_number {
    ($($method:ident $visit:ident $type:ty),*) => {$(
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, FieldsError> {
            visitor.$visit(self.parse::<$type>(stringify!($type))?)
        }
    )*};
}

impl<'de> de::Deserializer<'de> for Value<'_> {
    type Error = FieldsError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, FieldsError> {
        visitor.visit_string(self.0.to_owned())
    }

    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, FieldsError> {
        match self.0 {
            "1" => visitor.visit_bool(true),
            "0" => visitor.visit_bool(false),
            other => Err(FieldsError(format!("{other:?} is not a flag (1 or 0)"))),
        }
    }

    parse_number! {
        deserialize_i8 visit_i8 i8, deserialize_i16 visit_i16 i16, deserialize_i32 visit_i32 i32,
        deserialize_i64 visit_i64 i64, deserialize_u8 visit_u8 u8, deserialize_u16 visit_u16 u16,
        deserialize_u32 visit_u32 u32, deserialize_u64 visit_u64 u64, deserialize_f64 visit_f64 f64
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, FieldsError> {
        if self.0.is_empty() {
            visitor.visit_none()
        } else {
            visitor.visit_some(self)
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, FieldsError> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, FieldsError> {
        visitor.visit_enum(self.0.into_deserializer())
    }

    serde::forward_to_deserialize_any! {
        i128 u128 f32 char str string bytes byte_buf unit unit_struct seq tuple tuple_struct map
        struct identifier ignored_any
    }
}

/// Writes a struct as its fields; anything else is refused, since a stream entry is flat.
#[derive(Default)]
struct StructWriter {
    fields: Vec<(String, String)>,
}

fn flat_only() -> FieldsError {
    FieldsError("a job's entry type must be a struct of scalar fields".to_owned())
}

macro_rules! refuse {
    ($($method:ident($($arg:ty),*)),*) => {$(
        fn $method(self, $(_: $arg),*) -> Result<Self::Ok, FieldsError> {
            Err(flat_only())
        }
    )*};
}

impl ser::Serializer for StructWriter {
    type Ok = Vec<(String, String)>;
    type Error = FieldsError;
    type SerializeSeq = Impossible<Self::Ok, FieldsError>;
    type SerializeTuple = Impossible<Self::Ok, FieldsError>;
    type SerializeTupleStruct = Impossible<Self::Ok, FieldsError>;
    type SerializeTupleVariant = Impossible<Self::Ok, FieldsError>;
    type SerializeMap = Impossible<Self::Ok, FieldsError>;
    type SerializeStruct = Self;
    type SerializeStructVariant = Impossible<Self::Ok, FieldsError>;

    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Self, FieldsError> {
        Ok(self)
    }

    refuse! {
        serialize_bool(bool), serialize_i8(i8), serialize_i16(i16), serialize_i32(i32),
        serialize_i64(i64), serialize_u8(u8), serialize_u16(u16), serialize_u32(u32),
        serialize_u64(u64), serialize_f32(f32), serialize_f64(f64), serialize_char(char),
        serialize_str(&str), serialize_bytes(&[u8]), serialize_none(), serialize_unit(),
        serialize_unit_struct(&'static str),
        serialize_unit_variant(&'static str, u32, &'static str)
    }

    fn serialize_some<T: Serialize + ?Sized>(self, _: &T) -> Result<Self::Ok, FieldsError> {
        Err(flat_only())
    }

    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: &T,
    ) -> Result<Self::Ok, FieldsError> {
        Err(flat_only())
    }

    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &T,
    ) -> Result<Self::Ok, FieldsError> {
        Err(flat_only())
    }

    fn serialize_seq(self, _: Option<usize>) -> Result<Self::SerializeSeq, FieldsError> {
        Err(flat_only())
    }

    fn serialize_tuple(self, _: usize) -> Result<Self::SerializeTuple, FieldsError> {
        Err(flat_only())
    }

    fn serialize_tuple_struct(
        self,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleStruct, FieldsError> {
        Err(flat_only())
    }

    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleVariant, FieldsError> {
        Err(flat_only())
    }

    fn serialize_map(self, _: Option<usize>) -> Result<Self::SerializeMap, FieldsError> {
        Err(flat_only())
    }

    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStructVariant, FieldsError> {
        Err(flat_only())
    }
}

impl SerializeStruct for StructWriter {
    type Ok = Vec<(String, String)>;
    type Error = FieldsError;

    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        name: &'static str,
        value: &T,
    ) -> Result<(), FieldsError> {
        let text = value.serialize(ScalarWriter)?;
        self.fields.push((name.to_owned(), text));
        Ok(())
    }

    fn end(self) -> Result<Self::Ok, FieldsError> {
        Ok(self.fields)
    }
}

/// Writes one scalar as the string a script would write.
struct ScalarWriter;

macro_rules! display {
    ($($method:ident($type:ty)),*) => {$(
        fn $method(self, value: $type) -> Result<String, FieldsError> {
            Ok(value.to_string())
        }
    )*};
}

impl ser::Serializer for ScalarWriter {
    type Ok = String;
    type Error = FieldsError;
    type SerializeSeq = Impossible<String, FieldsError>;
    type SerializeTuple = Impossible<String, FieldsError>;
    type SerializeTupleStruct = Impossible<String, FieldsError>;
    type SerializeTupleVariant = Impossible<String, FieldsError>;
    type SerializeMap = Impossible<String, FieldsError>;
    type SerializeStruct = Impossible<String, FieldsError>;
    type SerializeStructVariant = Impossible<String, FieldsError>;

    display! {
        serialize_i8(i8), serialize_i16(i16), serialize_i32(i32), serialize_i64(i64),
        serialize_u8(u8), serialize_u16(u16), serialize_u32(u32), serialize_u64(u64),
        serialize_f32(f32), serialize_f64(f64), serialize_char(char), serialize_str(&str)
    }

    fn serialize_bool(self, value: bool) -> Result<String, FieldsError> {
        Ok(if value { "1" } else { "0" }.to_owned())
    }

    fn serialize_none(self) -> Result<String, FieldsError> {
        Ok(String::new())
    }

    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<String, FieldsError> {
        value.serialize(self)
    }

    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        value: &T,
    ) -> Result<String, FieldsError> {
        value.serialize(self)
    }

    fn serialize_unit_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
    ) -> Result<String, FieldsError> {
        Ok(variant.to_owned())
    }

    fn serialize_bytes(self, _: &[u8]) -> Result<String, FieldsError> {
        Err(flat_only())
    }

    fn serialize_unit(self) -> Result<String, FieldsError> {
        Err(flat_only())
    }

    fn serialize_unit_struct(self, _: &'static str) -> Result<String, FieldsError> {
        Err(flat_only())
    }

    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &T,
    ) -> Result<String, FieldsError> {
        Err(flat_only())
    }

    fn serialize_seq(self, _: Option<usize>) -> Result<Self::SerializeSeq, FieldsError> {
        Err(flat_only())
    }

    fn serialize_tuple(self, _: usize) -> Result<Self::SerializeTuple, FieldsError> {
        Err(flat_only())
    }

    fn serialize_tuple_struct(
        self,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleStruct, FieldsError> {
        Err(flat_only())
    }

    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleVariant, FieldsError> {
        Err(flat_only())
    }

    fn serialize_map(self, _: Option<usize>) -> Result<Self::SerializeMap, FieldsError> {
        Err(flat_only())
    }

    fn serialize_struct(
        self,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStruct, FieldsError> {
        Err(flat_only())
    }

    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStructVariant, FieldsError> {
        Err(flat_only())
    }
}

#[cfg(test)]
mod tests {
    use serde::{Deserialize, Serialize};

    use super::*;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Sample {
        event: String,
        user: i64,
        shard: u32,
        liked: bool,
        channel: Option<String>,
        device: Option<String>,
    }

    fn fields(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
            .collect()
    }

    #[test]
    fn a_struct_goes_to_fields_and_back() {
        let sample = Sample {
            event: "e1".into(),
            user: -4,
            shard: 3,
            liked: true,
            channel: Some("web".into()),
            device: None,
        };
        let written = to_fields(&sample).unwrap();
        assert_eq!(
            written,
            [
                ("event", "e1"),
                ("user", "-4"),
                ("shard", "3"),
                ("liked", "1"),
                ("channel", "web"),
                ("device", ""),
            ]
            .map(|(name, value)| (name.to_owned(), value.to_owned()))
        );
        let read: Sample = from_fields(&written.into_iter().collect()).unwrap();
        assert_eq!(read, sample);
    }

    #[test]
    fn fields_as_a_script_writes_them_decode_and_extra_ones_are_ignored() {
        let read: Sample = from_fields(&fields(&[
            ("event", "e2"),
            ("user", "7"),
            ("shard", "0"),
            ("liked", "0"),
            ("extra", "from a newer producer"),
        ]))
        .unwrap();
        assert_eq!(read.user, 7);
        assert!(!read.liked);
        assert_eq!((read.channel, read.device), (None, None));
    }

    #[test]
    fn malformed_or_missing_fields_are_refused() {
        let good = [
            ("event", "e3"),
            ("user", "7"),
            ("shard", "1"),
            ("liked", "1"),
        ];
        for (name, bad) in [("user", "seven"), ("shard", "-1"), ("liked", "2")] {
            let pairs: Vec<_> = good
                .iter()
                .map(|&(field, value)| (field, if field == name { bad } else { value }))
                .collect();
            let err = from_fields::<Sample>(&fields(&pairs)).unwrap_err();
            assert!(err.to_string().contains(bad), "{name} = {bad}: {err}");
        }
        let err = from_fields::<Sample>(&fields(&good[1..])).unwrap_err();
        assert!(err.to_string().contains("event"), "{err}");
    }

    #[test]
    fn nested_values_are_refused() {
        #[derive(Serialize)]
        struct Nested {
            list: Vec<i64>,
        }
        assert!(to_fields(&Nested { list: vec![1] }).is_err());
        assert!(to_fields(&7_i64).is_err());
    }
}
