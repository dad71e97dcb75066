pub mod bench;
pub mod compile;
pub mod demo;
pub mod devices;
pub mod inspect;
pub mod ops;
pub mod run;
pub mod tune;
