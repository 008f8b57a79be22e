pub mod attention;
