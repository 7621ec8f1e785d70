//! `cargo run -p ferrum-testdata`: unpacks the packed test fixtures (for the shell and Python
//! tests, which cannot call [`ferrum_testdata::fixtures`]) and prints the fixtures folder.

fn main() {
    println!("{}", ferrum_testdata::fixtures().display());
}
