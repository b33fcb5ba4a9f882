module github.com/pagedkv/pagedkv-go

go 1.19
