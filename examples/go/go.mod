module example.com/pagedkv-examples

go 1.19

require github.com/pagedkv/pagedkv-go v0.0.0

replace github.com/pagedkv/pagedkv-go => ../../bindings/go
