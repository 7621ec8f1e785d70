//! The GGUF reader on hand-built files: metadata arrays of every element type, and bad
//! arrays named in the error.
use super::*;

/// A GGUF v3 file with no tensors and `kvs` (key, type, value bytes) as its metadata.
fn file(kvs: &[(&str, u32, Vec<u8>)]) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend(0u64.to_le_bytes());
    b.extend((kvs.len() as u64).to_le_bytes());
    for (key, ty, value) in kvs {
        b.extend((key.len() as u64).to_le_bytes());
        b.extend(key.as_bytes());
        b.extend(ty.to_le_bytes());
        b.extend(value);
    }
    b
}

/// An array value: element type, count, then the elements' bytes.
fn array(elem: u32, count: u64, items: &[u8]) -> Vec<u8> {
    let mut b = elem.to_le_bytes().to_vec();
    b.extend(count.to_le_bytes());
    b.extend(items);
    b
}

fn strings(items: &[&str]) -> Vec<u8> {
    let mut b = Vec::new();
    for s in items {
        b.extend((s.len() as u64).to_le_bytes());
        b.extend(s.as_bytes());
    }
    array(8, items.len() as u64, &b)
}

fn parse(bytes: &[u8]) -> Result<GgufFile> {
    GgufFile::from_bytes(Path::new("t.gguf"), bytes)
}

#[test]
fn arrays_keep_their_element_types() {
    let floats: Vec<u8> = [1.5f32, -2.0]
        .iter()
        .flat_map(|f| f.to_le_bytes())
        .collect();
    let ints: Vec<u8> = [-3i32, 7].iter().flat_map(|i| i.to_le_bytes()).collect();
    let nested = {
        let mut b = strings(&["x"]);
        b.extend(array(0, 2, &[4, 5]));
        array(9, 2, &b)
    };
    let g = parse(&file(&[
        ("s", 9, strings(&["▁a", "", "<0x0A>"])),
        ("f", 9, array(6, 2, &floats)),
        ("i", 9, array(5, 2, &ints)),
        ("b", 9, array(7, 3, &[1, 0, 1])),
        ("n", 9, nested),
    ]))
    .expect("parses");
    let get = |k: &str| g.get(k).and_then(GgufValue::as_array).expect("an array");
    let s = get("s").as_strings().expect("strings");
    assert_eq!(s.iter().collect::<Vec<_>>(), ["▁a", "", "<0x0A>"]);
    assert_eq!(s.get(3), None);
    assert_eq!(get("f"), &GgufArray::F32(vec![1.5, -2.0]));
    assert_eq!(get("i").get(0), Some(GgufValue::I32(-3)));
    assert_eq!(get("b"), &GgufArray::Bool(vec![true, false, true]));
    let n = get("n");
    assert_eq!((n.len(), n.element_type_name()), (2, "array"));
    assert_eq!(n.get(1), Some(GgufValue::Array(GgufArray::U8(vec![4, 5]))));
    assert_eq!(get("s").iter().count(), 3);
}

#[test]
fn bad_arrays_are_named() {
    let deep = array(9, 1, &array(9, 1, &array(0, 0, &[])));
    // An empty array of arrays two deep nests nothing: accepted, as it always was.
    let empty = array(9, 1, &array(9, 0, &[]));
    assert!(parse(&file(&[("k", 9, empty)])).is_ok());
    let cases = [
        (array(7, 1, &[2]), "bool byte 2"),
        (
            array(8, 1, &[1, 0, 0, 0, 0, 0, 0, 0, 0xff]),
            "not valid UTF-8",
        ),
        (deep, "nested too deeply"),
        (array(13, 0, &[]), "unknown array element type 13"),
        (array(6, 1 << 40, &[]), "cannot fit"),
    ];
    for (value, want) in cases {
        let err = parse(&file(&[("k", 9, value)]))
            .expect_err(want)
            .to_string();
        assert!(err.contains(want), "{err} should say {want}");
    }
}
