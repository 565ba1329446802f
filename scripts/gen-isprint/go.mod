module cmpwarden.test/gen-isprint

go 1.26
