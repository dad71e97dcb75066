pub mod bench;
pub mod demo;
pub mod devices;
pub mod run;
