"""`minedraft bench`: side-by-side measurement of ar, sd and psd through the public API."""
